"""New events and new aggregates of the creation path, made with less of the
library's generic work per event (a create makes four events: CPU on the
request path).

eventsourcing's ``_create`` and ``trigger_event`` copy their keyword
arguments and filter them for ``create_id``'s parameters, and its created
event's ``mutate`` filters the event's fields twice against the aggregate's
``__base_init__`` and ``__init__`` signatures, looked up per event. Here the
same calls are made with those lookups done once per class: ``DirectEvents``
(an aggregate mix-in) and ``DirectInit`` (a created event's mix-in), each
placed before the library's class in the bases. The events are the library's
own classes, built by their own constructors: the same objects, the same
stored bytes. tests/unit/test_direct_events.py compares both ways.
"""

from __future__ import annotations

import inspect
import operator
import uuid
from collections.abc import Callable
from typing import Any, Self, cast

from eventsourcing.utils import get_topic, resolve_topic

# Per aggregate class: its __init__'s parameter names but self, whether one of
# them is ``id`` (which the created event gives as originator_id), and, when
# all are plain positional-or-keyword ones other than ``id``, a getter of
# their values from an event's fields in order (one C call).
_Parameters = tuple[tuple[str, ...], bool, Callable[[dict[str, Any]], tuple[Any, ...]] | None]
_INIT_PARAMETERS: dict[type[Any], _Parameters] = {}


def _init_parameters(aggregate_class: type[Any]) -> _Parameters:
    found = _INIT_PARAMETERS.get(aggregate_class)
    if found is None:
        parameters = list(inspect.signature(aggregate_class.__init__).parameters.values())[1:]
        names = tuple(p.name for p in parameters if p.name != "id")
        with_id = len(names) < len(parameters)
        positional = not with_id and all(
            p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters
        )
        # The extra key makes itemgetter answer a tuple for any count of names.
        pick = operator.itemgetter(*names, "originator_id") if positional else None
        found = _INIT_PARAMETERS[aggregate_class] = (names, with_id, pick)
    return found


class DirectInit:
    """A created event's mix-in: ``CanInitAggregate.mutate`` (a new aggregate
    from the event's fields) with the ``__init__`` parameters read once per
    aggregate class."""

    def mutate(self, aggregate: Any) -> Any:
        if aggregate is not None:
            return super().mutate(aggregate)  # type: ignore[misc]  # refused there, as always
        state = self.__dict__
        aggregate_class = resolve_topic(state["originator_topic"])
        made = aggregate_class.__new__(aggregate_class)
        made.__base_init__(state["originator_id"], state["originator_version"], state["timestamp"])
        names, with_id, pick = _init_parameters(aggregate_class)
        try:
            if pick is None:
                raise KeyError
            values = pick(state)[:-1]
        except KeyError:  # not every parameter is a field: only those that are
            arguments = {name: state[name] for name in names if name in state}
            if with_id:
                arguments["id"] = state["originator_id"]
            made.__init__(**arguments)
        else:
            made.__init__(*values)
        cast(Any, self).apply(made)
        return made


class DirectEvents:
    """An aggregate mix-in: ``trigger_event`` and ``_create`` (given an id)
    without the library's argument copies and ``create_id`` filter."""

    def trigger_event(self, event_class: type[Any], **kwargs: Any) -> None:
        """``BaseAggregate.trigger_event``: the next event, applied and pending."""
        aggregate: Any = self
        kwargs["originator_id"] = aggregate.id
        kwargs["originator_version"] = aggregate.version + 1
        if kwargs.get("timestamp") is None:
            kwargs["timestamp"] = event_class.create_timestamp()
        event = event_class(**kwargs)
        event.mutate(aggregate)
        aggregate.pending_events.append(event)

    @classmethod
    def _create(cls, event_class: type[Any], *, id: Any = None, **kwargs: Any) -> Self:
        """``BaseAggregate._create`` for a given UUID: the aggregate its
        created event makes, with that event pending."""
        if not isinstance(id, uuid.UUID):
            return cast(Self, super()._create(event_class, id=id, **kwargs))  # type: ignore[misc]
        kwargs["originator_topic"] = get_topic(cls)
        kwargs["originator_id"] = id
        kwargs["originator_version"] = cast(Any, cls).INITIAL_VERSION
        if kwargs.get("timestamp") is None:
            kwargs["timestamp"] = event_class.create_timestamp()
        created = event_class(**kwargs)
        aggregate = created.mutate(None)
        aggregate.pending_events.append(created)
        return cast(Self, aggregate)
