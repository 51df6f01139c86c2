"""What of a RabbitMQ definitions document Warren supports. An import refuses a
document holding anything else (topic permissions, runtime and global
parameters other than vhost limits, policy keys Warren does not apply, vhost
settings it lacks), naming each item, unless told to skip them: then they are
dropped here and the rest is imported."""

from __future__ import annotations

import msgspec

from ..broker import policies

VHOST_LIMITS = "vhost-limits"  # the one runtime-parameter component Warren has
# It names the exporting cluster, not a setting: nothing to carry over.
IGNORED_GLOBAL_PARAMETERS = {"internal_cluster_id"}
POLICY_KEYS = {*policies.QUEUE_KEYS, *policies.EXCHANGE_KEYS}


def unsupported(loaded: dict[str, list]) -> list[str]:
    """Each unsupported item of the well-formed ones, with its place and name."""
    found = []
    for i, t in loaded["topic_permissions"]:
        found.append(f"topic_permissions[{i}]: topic permissions are not supported (user "
                     f"'{t.user}', vhost '{t.vhost}', exchange '{t.exchange}')")
    for i, p in loaded["parameters"]:
        if p.component != VHOST_LIMITS:
            found.append(f"parameters[{i}]: parameters of component '{p.component}' are not "
                         f"supported ('{p.name}' in vhost '{p.vhost}')")
    for i, g in loaded["global_parameters"]:
        if g.name not in IGNORED_GLOBAL_PARAMETERS:
            found.append(f"global_parameters[{i}]: global parameter '{g.name}' is not supported")
    for i, p in loaded["policies"]:
        for key in p.definition:
            if key not in POLICY_KEYS:
                found.append(f"policies[{i}].definition.{key}: policy key '{key}' is not "
                             f"supported (policy '{p.name}' in vhost '{p.vhost}')")
    for i, v in loaded["vhosts"]:
        for field, value in (("default_queue_type", v.default_queue_type),
                             ("metadata.default_queue_type", v.metadata.default_queue_type)):
            if value not in ("classic", "undefined"):
                found.append(f"vhosts[{i}].{field}: '{value}' is not supported, only classic "
                             f"(vhost '{v.name}')")
        for field, value in (("tags", v.tags), ("metadata.tags", v.metadata.tags)):
            if value:
                found.append(f"vhosts[{i}].{field}: vhost tags are not supported "
                             f"(vhost '{v.name}')")
        if v.tracing:
            found.append(f"vhosts[{i}].tracing: tracing is not supported (vhost '{v.name}')")
    return found


def drop(loaded: dict[str, list]) -> None:
    """Leave out what unsupported() reports: a policy loses its unsupported keys
    (and goes when none is left); vhosts import without the settings Warren lacks."""
    loaded["topic_permissions"] = []
    loaded["global_parameters"] = []
    loaded["parameters"] = [(i, p) for i, p in loaded["parameters"]
                            if p.component == VHOST_LIMITS]
    kept = []
    for i, p in loaded["policies"]:
        definition = {k: v for k, v in p.definition.items() if k in POLICY_KEYS}
        if definition:
            kept.append((i, msgspec.structs.replace(p, definition=definition)))
    loaded["policies"] = kept
