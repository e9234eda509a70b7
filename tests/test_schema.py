"""tokenpo.schema: a field's constraint, declared with setting(), is checked with one message format."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tokenpo.errors import ConfigError
from tokenpo.schema import Rule, build, check_field, check_fields, non_empty, require, section, setting

KINDS = ["a", "b"]


@dataclass
class Inner:
    width: int = setting(2, "width", ge=1)

    def validate(self) -> None:
        check_fields(self, "demo.inner")


@dataclass
class Demo:
    count: int = setting(1, "count", ge=1)
    share: float = setting(0.5, "share", gt=0, le=1)
    cap: float | None = setting(None, "cap", gt=1)
    coef: float = setting(0.0, "coef", finite=True)
    kind: str = setting("a", "kind", choices=lambda: KINDS)
    label: str = setting("x", "label", check=non_empty, requirement="a non-empty label")
    items: list[int] = setting([1, 2], "items")
    inner: Inner = section(Inner, "inner")

    def validate(self) -> None:
        check_fields(self, "demo")
        require(self.count <= 10 or self.cap is None, "demo.count above 10 needs demo.cap=null")
        self.inner.validate()


@pytest.mark.parametrize(("values", "message"), [
    ({"count": 0}, "demo.count must be >= 1, got 0"),
    ({"share": 0}, "demo.share must be in (0, 1], got 0.0"),
    ({"cap": 1}, "demo.cap must be null or > 1, got 1.0"),
    ({"coef": float("inf")}, "demo.coef must be a finite number, got inf"),
    ({"kind": "c"}, "demo.kind must be one of a, b, got 'c'"),
    ({"label": "  "}, "demo.label must be a non-empty label, got '  '"),
    ({"inner": {"width": 0}}, "demo.inner.width must be >= 1, got 0"),
    ({"count": 11, "cap": 2}, "demo.count above 10 needs demo.cap=null"),
])
def test_a_bad_value_is_one_line_naming_its_key(values, message):
    with pytest.raises(ConfigError) as err:
        build(Demo, values, "demo")
    assert str(err.value) == message


def test_good_values_and_null_for_an_optional_field_pass():
    cfg = build(Demo, {"count": 3, "share": 1, "cap": None, "coef": -2.0, "kind": "b"}, "demo")
    assert (cfg.count, cfg.share, cfg.cap, cfg.kind) == (3, 1.0, None, "b")


def test_a_config_built_by_hand_is_checked_by_type_as_well():
    """from_dict refuses wrong types first; a dataclass built in code reaches its rules with them."""
    for count in (True, 2.0, "3"):
        with pytest.raises(ConfigError, match=rf"^demo.count must be >= 1, got {count!r}$"):
            Demo(count=count).validate()
    Demo(share=1).validate()  # an int is a float


def test_choices_are_read_when_checked():
    """A registry's names are passed as its `names` function: an entry registered after import is accepted."""
    with pytest.raises(ConfigError):
        Demo(kind="c").validate()
    KINDS.append("c")
    try:
        Demo(kind="c").validate()
    finally:
        KINDS.remove("c")


def test_list_defaults_are_not_shared():
    first, second = Demo(), Demo()
    first.items.append(3)
    assert second.items == [1, 2]


def test_check_field_checks_a_value_from_elsewhere_with_the_field_rule():
    check_field(Demo, "cap", None, "the dataset's cap")
    with pytest.raises(ConfigError, match=r"^the dataset's cap must be null or > 1, got 0.5$"):
        check_field(Demo, "cap", 0.5, "the dataset's cap")


@pytest.mark.parametrize(("rule", "wording"), [
    (Rule(ge=0, lt=1), "in [0, 1)"),
    (Rule(gt=0), "> 0"),
    (Rule(le=5), "<= 5"),
    (Rule(finite=True, ge=0), "a finite number >= 0"),
    (Rule(choices=("x", "y"), requirement="x or y"), "x or y"),
])
def test_rule_wording(rule, wording):
    assert rule.wording(optional=False) == wording
