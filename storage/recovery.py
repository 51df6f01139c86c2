"""What the broker does with its data directory before it starts.

Every store is checked (storage.verify). On damage the broker refuses to start
with one line (`Refused`) naming the store and the way out; started again with
that way out, it takes it and reports what was lost:

* quarantine (`--quarantine-damaged`): a damaged shard store is moved to
  DATA/quarantine/ and replaced by a new one holding every record of it that
  still reads and passes its checksum, with the journal's intact records
  applied on top (storage.salvage); the report says how many were kept and
  lost. One that meta/ lists but is gone is replaced by an empty one.
* rebuild (`--rebuild-definitions`): a missing or damaged meta/ (a damaged one
  is moved to DATA/quarantine/) is rebuilt from the queue records of the shard
  stores; what only meta/ held (users, permissions, exchanges, bindings,
  policies) is lost.

meta/ lists the shard stores the directory has had, so a store that vanished
(a deleted or emptied data.mdb) is noticed rather than recreated empty.
"""

from __future__ import annotations

import os
import shutil
import time

from .metastore import MetaStore, QueueDef, VHostDef
from .salvage import salvage
from .shardstore import ShardStore
from .upgrade import upgrade
from .verify import StoreReport, check_store, check_stores


def outdated(found: int) -> str:
    return (f"written by an earlier Warren (format {found}); `warren serve` upgrades it when "
            "it starts")


class Refused(Exception):
    """The broker must not start: the message says why and what to do."""


class Survey:
    """The stores of a data directory, checked, and how they fit together."""

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.meta_path = os.path.join(data_dir, "meta")
        self.shard_paths = {int(e[6:]): os.path.join(data_dir, e) for e in os.listdir(data_dir)
                            if e.startswith("shard-") and e[6:].isdigit()}
        has_meta = os.path.isfile(os.path.join(self.meta_path, "data.mdb"))
        reports = check_stores(([self.meta_path] if has_meta else [])
                               + list(self.shard_paths.values()))
        self.meta = reports.pop(0) if has_meta else None
        self.shards = dict(zip(self.shard_paths, reports))
        self.known: set[int] | None = None  # the stores meta/ lists
        self.queue_defs: list[QueueDef] = []
        if self.meta is not None and not self.meta.problems and not self.meta.outdated:
            meta = MetaStore(self.meta_path, readonly=True)
            try:
                self.known = meta.stores()
                self.queue_defs = meta.load().queues
            finally:
                meta.close()

    def damaged(self) -> dict[int, str]:
        """Shard stores that are damaged, or listed by meta/ and gone: K -> why."""
        found = {k: "; ".join(report.problems) for k, report in self.shards.items()
                 if report.problems}
        for k in sorted((self.known or set()) - set(self.shards)):
            found[k] = "it is missing, though meta/ lists it"
        return found

    def meta_lost(self) -> bool:
        """meta/ is gone or damaged, or never knew the shard stores it sits beside."""
        return (self.meta is None or bool(self.meta.problems)
                or (self.known is None and not self.queue_defs))

    def meta_state(self) -> str:
        if self.meta is None:
            return "missing"
        return "damaged" if self.meta.problems else "empty"

    def orphans(self) -> list[StoreReport]:
        """Sound shard stores that hold queues (which a lost meta/ knew)."""
        return [r for r in self.shards.values() if r.queues and not r.problems]

    def lines(self) -> list[str]:
        """One line per store and per problem, for `warren inspect --verify`."""
        out = []
        if self.meta is None:
            out.append(f"{self.meta_path}: missing")
        elif self.meta.outdated:
            out.append(f"{self.meta_path}: {outdated(self.meta.outdated)}")
        else:
            out.append(f"{self.meta_path}: " + ("; ".join(self.meta.problems) or "ok"))
        damaged = self.damaged()
        for k in sorted(set(self.shards) | set(damaged)):
            report = self.shards.get(k)
            path = os.path.join(self.data_dir, f"shard-{k}")
            if report is not None and report.outdated:
                out.append(f"{path}: {outdated(report.outdated)}")
            elif k in damaged:
                out.append(f"{path}: DAMAGED: {damaged[k]}")
                readable = report.messages if report else {}
                lived = ([(d.qid, d.spec) for d in self.queue_defs if d.shard == k]
                         or [(qid, q.spec) for qid, q in (report.queues if report else {}).items()])
                out += [f"  queue '{spec.name}' in vhost '{spec.vhost}' lived here "
                        f"({readable.get(qid, 0)} of its messages readable)"
                        for qid, spec in lived]
            elif report is not None:  # sound (a store not in shards is damaged)
                out.append(f"{path}: ok, {len(report.queues)} queues, "
                           f"{sum(report.messages.values())} messages")
        if self.meta_lost() and self.orphans():
            out.append(f"{self.meta_path} is {self.meta_state()}: the shard stores hold "
                       f"{self.orphan_summary()} it does not define")
        return out

    def ok(self) -> bool:
        return not self.damaged() and not (self.meta and self.meta.problems) and not (
            self.meta_lost() and self.orphans())

    def orphan_summary(self) -> str:
        orphans = self.orphans()
        queues = sum(len(r.queues) for r in orphans)
        messages = sum(sum(r.messages.values()) for r in orphans)
        return f"{queues} queues with {messages} messages"


class Recovery:
    def __init__(self, upgraded: list[str], report: list[str], rebuilt: bool):
        self.upgraded = upgraded  # stores brought to today's format (nothing lost)
        self.report = report  # what was set aside or rebuilt, and what was lost
        self.rebuilt = rebuilt  # meta/ was rebuilt: the broker adds its default user


def prepare(data_dir: str, shard_count: int, quarantine: bool = False,
            rebuild: bool = False) -> Recovery:
    """Upgrade stores an earlier Warren wrote, check the data directory and make it
    ready for `shard_count` shards, or raise Refused."""
    survey = Survey(data_dir)
    upgraded: list[str] = []
    # Only stores the checker found whole and outdated: reading a truncated one
    # here would crash the broker (SIGBUS).
    for store in [survey.meta, *survey.shards.values()]:
        if store is not None and store.outdated:
            done = upgrade(store.path)
            if done is not None:
                upgraded.append(done.describe(store.path))
    if upgraded:
        survey = Survey(data_dir)
    report: list[str] = []
    verify_hint = f"see `warren inspect --verify {data_dir}`"
    if survey.meta is not None and survey.meta.problems:
        if not rebuild:
            raise Refused(f"the metadata store {survey.meta_path} is damaged "
                          f"({survey.meta.problems[0]}); {verify_hint}, then start with "
                          "--rebuild-definitions to rebuild it from the shard stores, or "
                          f"restore {data_dir} from a backup")
        report.append(f"moved the damaged {survey.meta_path} to {_set_aside(survey.meta_path)}")
    damaged = survey.damaged()
    if damaged:
        k = min(damaged)
        more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
        path = os.path.join(data_dir, f"shard-{k}")
        if not quarantine:
            raise Refused(f"the shard store {path} is damaged ({damaged[k]}){more}; "
                          f"{verify_hint}, then start with --quarantine-damaged to set it "
                          f"aside and serve what of it still reads, or restore {data_dir} from "
                          "a backup")
        report += _quarantine(survey, damaged)
    orphans = survey.orphans()
    rebuilt = survey.meta_lost() and bool(orphans)
    if rebuilt and not rebuild:
        raise Refused(f"{survey.meta_path} is {survey.meta_state()} but the shard stores hold "
                      f"{survey.orphan_summary()}; start with --rebuild-definitions to rebuild "
                      f"the definitions from them, or move {data_dir}/shard-* away to start "
                      "empty")
    meta = MetaStore(survey.meta_path)
    try:
        if rebuilt:
            report += _rebuild(meta, orphans, survey.shard_paths)
        stores = set(survey.shards) | set(range(shard_count))
        for k in sorted(stores - set(survey.shards)):  # new, or in place of a quarantined one
            ShardStore(os.path.join(data_dir, f"shard-{k}"), 1 << 20).close()
        if meta.stores() != stores:  # a write, which a full disk refuses, only if new
            meta.set_stores(stores)
    finally:
        meta.close()
    return Recovery(upgraded, report, rebuilt)


def _set_aside(path: str) -> str:
    """Move a store to DATA/quarantine/NAME-TIME and return where."""
    data_dir, name = os.path.split(path)
    target = os.path.join(data_dir, "quarantine",
                          f"{name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.rename(path, target)
    return target


def _quarantine(survey: Survey, damaged: dict[int, str]) -> list[str]:
    lines = []
    for k, why in sorted(damaged.items()):
        path = os.path.join(survey.data_dir, f"shard-{k}")
        if not os.path.exists(path):
            lines.append(f"the shard store {path} is missing; an empty one replaces it")
            lines += [f"queue '{d.spec.name}' in vhost '{d.spec.vhost}' comes back empty"
                      for d in survey.queue_defs if d.shard == k]
            survey.shards.pop(k, None)
            continue
        # Salvaged beside it first: a crash meanwhile leaves the damaged store in place.
        target = path + ".salvage"
        shutil.rmtree(target, ignore_errors=True)
        done = salvage(path, target)
        aside = _set_aside(path)
        os.rename(target, path)
        lines.append(f"quarantined the damaged shard store {path} ({why}) in {aside}; what "
                     f"reads of it is served: {done.describe()}")
        lines += [f"queue '{d.spec.name}' in vhost '{d.spec.vhost}': "
                  f"{done.messages.get(d.qid, 0)} messages kept"
                  for d in survey.queue_defs if d.shard == k]
        survey.shards[k] = check_store(path)
    return lines


def _rebuild(meta: MetaStore, orphans: list[StoreReport], shard_paths: dict[int, str]) -> list[str]:
    """Queue definitions (and their vhosts) from the shard stores' queue records."""
    shard_of = {path: k for k, path in shard_paths.items()}
    vhosts, queues, messages, top = set(), 0, 0, 0
    for report in orphans:
        for qid, q in report.queues.items():
            meta.put_queue(QueueDef(q.spec, qid, shard_of[report.path]))
            vhosts.add(q.spec.vhost)
            queues += 1
            messages += report.messages.get(qid, 0)
            top = max(top, qid)
    for name in vhosts:
        meta.put_vhost(VHostDef(name))
    meta.raise_next_qid(top + 1)
    return [f"rebuilt {meta.env.path()} from the shard stores: {queues} queues with {messages} "
            f"messages in {len(vhosts)} vhosts ({', '.join(sorted(vhosts))})",
            "lost with the old meta/: users and permissions (the default user is created "
            "again), exchanges, bindings, policies and vhost limits"]
