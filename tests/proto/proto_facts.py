"""Comparing generated protobuf modules with kubelet's published wire facts: message -> {field name: (number, type
or message name, repeated)}."""

from __future__ import annotations

from types import ModuleType

from google.protobuf.descriptor import FieldDescriptor

S, B, I32, I64, U64 = "string", "bool", "int32", "int64", "uint64"
SCALARS = {
    FieldDescriptor.TYPE_STRING: S,
    FieldDescriptor.TYPE_BOOL: B,
    FieldDescriptor.TYPE_INT32: I32,
    FieldDescriptor.TYPE_INT64: I64,
    FieldDescriptor.TYPE_UINT64: U64,
}


def describe(field: FieldDescriptor) -> tuple[int, str, bool]:
    """(number, scalar type or message name, repeated) of one field."""
    kind = field.message_type.name if field.message_type is not None else SCALARS[field.type]
    repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == FieldDescriptor.LABEL_REPEATED
    return field.number, kind, repeated


def assert_messages(module: ModuleType, facts: dict[str, dict[str, tuple[int, str, bool]]]) -> None:
    """The module declares exactly the messages of `facts`, each with exactly those fields."""
    messages = module.DESCRIPTOR.message_types_by_name
    assert set(messages) == set(facts)
    for name, fields in facts.items():
        assert {f.name: describe(f) for f in messages[name].fields} == fields, name
