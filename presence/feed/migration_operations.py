"""A migration operation for the feed's move into an app of its own (presence_feed 0001)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.migrations.operations.base import Operation
from django.db.migrations.state import ProjectState


class CreateOrTakeOver(Operation):
    """Run ``operations`` (CreateModel and friends) on a fresh database; where every table of
    ``legacy_tables`` ({model name: old table}) already exists — created by presence's
    0002_feed before the feed became an app — rename those tables to the models' tables
    instead, keeping their rows, keys, indexes and constraints (the models keep the old index
    and constraint names). The migration state is the same either way."""

    reversible = True

    def __init__(self, operations: Sequence[Operation], legacy_tables: dict[str, str]) -> None:
        self.operations = list(operations)
        self.legacy_tables = dict(legacy_tables)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (
            self.__class__.__qualname__,
            [self.operations],
            {"legacy_tables": self.legacy_tables},
        )

    def describe(self) -> str:
        return "Create the feed's tables, or take over presence's old ones"

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        for operation in self.operations:
            operation.state_forwards(app_label, state)

    def _legacy_present(self, schema_editor: Any) -> bool:
        existing = set(schema_editor.connection.introspection.table_names())
        present = [table for table in self.legacy_tables.values() if table in existing]
        if present and len(present) != len(self.legacy_tables):
            missing = sorted(set(self.legacy_tables.values()) - set(present))
            raise RuntimeError(
                f"The activity feed's old tables are only partly there (missing: "
                f"{', '.join(missing)}); restore them or drop {', '.join(sorted(present))} "
                f"before migrating presence_feed."
            )
        return bool(present)

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        alias = schema_editor.connection.alias
        if self._legacy_present(schema_editor):
            for model_name, old_table in self.legacy_tables.items():
                model = to_state.apps.get_model(app_label, model_name)
                if self.allow_migrate_model(alias, model):
                    schema_editor.alter_db_table(model, old_table, model._meta.db_table)
            return
        state = from_state
        for operation in self.operations:
            new_state = state.clone()
            operation.state_forwards(app_label, new_state)
            operation.database_forwards(app_label, schema_editor, state, new_state)
            state = new_state

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        # As rolling back any CreateModel: the feed's tables are dropped.
        states = [to_state]
        for operation in self.operations:
            state = states[-1].clone()
            operation.state_forwards(app_label, state)
            states.append(state)
        for index in reversed(range(len(self.operations))):
            self.operations[index].database_backwards(
                app_label, schema_editor, states[index + 1], states[index]
            )
