"""Who asks: a request's Basic credentials checked against the broker's users,
with the same login throttle as AMQP's, and RabbitMQ's 401s."""

from __future__ import annotations

import asyncio
import logging

from .http import HTTPError, Request, not_authorised
from .rights import MANAGEMENT_TAGS

log = logging.getLogger("warren.management")


async def authenticate(access, request: Request) -> None:
    """log_in, then 401 unless the user has a tag that may use the API."""
    await log_in(access, request)
    if MANAGEMENT_TAGS.isdisjoint(request.user.tags):
        raise not_authorised("Not management user")


async def log_in(access, request: Request) -> None:
    """Set request.user from the credentials, or 401. A login from an address the
    broker (`access`) throttles waits its turn before its password is checked, as
    an AMQP one does; a refusal is answered after the throttle's delay. The loop
    serves everyone else meanwhile."""
    credentials = request.credentials()
    # Browsers answer a challenge with a password dialog: the dashboard signs in
    # with its own form, so its requests (X-Requested-With) get none.
    challenge = ({} if "x-requested-with" in request.headers
                 else {"WWW-Authenticate": 'Basic realm="Warren management"'})
    if credentials is None:
        raise HTTPError(401, "not_authorised", "Not_Authorized", challenge)
    name, password = credentials
    peer = request.peer
    at_turn, waited = False, 0.0
    if access.must_wait(peer):
        wait = await _answer(lambda answered: access.login_turn(peer, answered))
        if wait is None:  # its turn is too far off: refused unchecked, as slowly
            delay = access.throttle.cap
            log.warning("HTTP access denied: user '%s' - too many failed logins (from "
                        "%s, answered in %gs)", name, peer, delay)
            await asyncio.sleep(delay)
            raise HTTPError(401, "not_authorised", "Login failed", challenge)
        await asyncio.sleep(wait)
        at_turn, waited = True, wait
    reason = access.refusal(name, password, peer)
    if reason is None:
        request.user = access.users[name]
        return
    delay = await _answer(lambda answered: access.login_failed(
        name, reason, peer, "HTTP", at_turn, waited, answered))
    await asyncio.sleep(delay or 0.0)
    raise HTTPError(401, "not_authorised", "Login failed", challenge)


async def _answer(ask):
    """What `ask(answered)` passes to `answered`, now or later (from the root)."""
    answer = asyncio.get_running_loop().create_future()
    ask(lambda value: answer.done() or answer.set_result(value))
    return await answer
