"""tbcoll.core.records.record: typing.NamedTuple's class syntax, without typing."""

import pytest

from tbcoll.core.records import record


@record
class Point:
    """A point."""

    x: int
    y: int = 0  # a default
    label: str = ""

    @property
    def norm1(self) -> int:
        return abs(self.x) + abs(self.y)


def test_a_record_is_a_named_tuple_with_its_defaults_methods_and_docstring():
    p = Point(3, y=-4)
    assert p == (3, -4, "") and isinstance(p, tuple)
    assert Point._fields == ("x", "y", "label") and Point._field_defaults == {"y": 0, "label": ""}
    assert p.norm1 == 7 and p._replace(label="a").label == "a"
    assert Point.__doc__ == "A point." and Point.__module__ == __name__
    assert not hasattr(p, "__dict__")  # slots, as a NamedTuple's
    with pytest.raises(TypeError):
        Point()  # x has no default


def test_a_field_without_a_default_after_one_with_a_default_is_refused():
    with pytest.raises(TypeError, match="Bad: a field without a default follows one"):
        @record
        class Bad:
            a: int = 1
            b: int
