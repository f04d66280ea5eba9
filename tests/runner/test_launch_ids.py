"""Server ids of a resumed launch: new servers never take the rows of those that measured before."""

from __future__ import annotations

from compiler.plan import Launch
from runner.execute.driver import fresh_server_ids
from runner.store.records import base_server_id


def _launch(lid: str, server_ids: tuple[str, ...]) -> Launch:
    return Launch.model_construct(id=lid, server_ids=server_ids)


def test_fresh_ids_take_the_first_free_suffix() -> None:
    one = _launch("s/a", ("s/a",))
    assert fresh_server_ids(one, set()) == ("s/a",)
    assert fresh_server_ids(one, {"s/a"}) == ("s/a~2",)
    assert fresh_server_ids(one, {"s/a", "s/a~2"}) == ("s/a~3",)
    assert fresh_server_ids(one, {"s/b", "s/a~2"}) == ("s/a",)  # its own id is free
    pair = _launch("s/r", ("s/r/s1", "s/r/s2"))
    assert fresh_server_ids(pair, {"s/r/s2"}) == ("s/r/s1~2", "s/r/s2~2")  # replicas move together
    assert fresh_server_ids(_launch("s/x", ()), {"s/x"}) == ("s/x~2",)  # a v1 plan: the launch id


def test_base_server_id_strips_only_a_resume_suffix() -> None:
    assert base_server_id("s/a~2") == "s/a" and base_server_id("s/a~13") == "s/a"
    assert base_server_id("s/a") == "s/a" and base_server_id("s/a~1") == "s/a~1"
    assert base_server_id("s/a~x") == "s/a~x" and base_server_id("s~2/a") == "s~2/a"
