"""Engine.stop's door (Engine.admission): what is being taken in when a stop begins finishes being
taken in; what comes after is refused with EngineStopping, whatever task it comes from."""

from __future__ import annotations

import asyncio

from aiops.engine.engine import EngineStopping
from aiops.engine.events import SESSION

MYSQL_OFF = {"plugins.toml": "[mysql]\nenabled = false\n"}


async def test_a_task_born_inside_an_admission_is_refused_once_the_stop_has_begun(engine_factory, fake_openai) -> None:
    """A bus listener (a plugin's relay, say) that starts a task when a session is created runs
    inside the submit's admission: the task inherits _ADMITTED=True for good, and every submit it
    makes later passes as 'nested' -- neither refused nor waited for by a stop."""
    engine = await engine_factory(extra_files=MYSQL_OFF)
    go = asyncio.Event()
    outcome: list[object] = []

    async def relay() -> None:  # long-lived: forwards something to the engine later
        await go.wait()
        try:
            outcome.append(await engine.submit("api-later", "a message from the relay", kind="api"))
        except Exception as e:  # noqa: BLE001
            outcome.append(e)

    tasks: list[asyncio.Task[None]] = []

    def listener(event) -> None:
        if event.name == SESSION and event.data.get("change") == "created" and event.session_id == "api-first":
            tasks.append(asyncio.get_running_loop().create_task(relay()))

    engine.bus.add_listener(listener)
    result = await engine.run("api-first", "hi", kind="api", timeout=10)
    assert result.status == "complete" and tasks

    stopping = asyncio.create_task(engine.stop())
    await asyncio.sleep(0)
    assert engine.stopping
    go.set()
    await asyncio.wait_for(tasks[0], 10)
    await asyncio.wait_for(stopping, 30)
    assert len(outcome) == 1
    assert isinstance(outcome[0], EngineStopping), f"expected EngineStopping, got {outcome[0]!r}"


async def test_one_engines_admission_does_not_open_another_engines(engine_factory, fake_openai, tmp_path) -> None:
    """_ADMITTED is module-global, not per engine: inside engine A's admission, a stopping engine
    B takes a message without refusing it (two engines in one process: tests, embedding)."""
    from aiops.engine.engine import Engine
    from tests.support.engine import load_test_config

    a = await engine_factory(extra_files=MYSQL_OFF)
    b = Engine(load_test_config(tmp_path / "b", fake_openai, MYSQL_OFF))
    await b.start()
    await b.stop()
    with a.admission():
        try:
            await b.submit("api-b", "hello", kind="api")
        except EngineStopping:
            return
        except Exception as e:  # noqa: BLE001 - e.g. the closed store
            raise AssertionError(f"not refused with EngineStopping: {e!r}") from e
    raise AssertionError("a stopped engine took a message because another engine's admission was open")
