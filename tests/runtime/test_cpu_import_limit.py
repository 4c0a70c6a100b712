"""The CPU pool's import limit: a handler module that never finishes importing is named as such."""

from __future__ import annotations

import pytest

from pipeline.runtime import cpu
from pipeline.runtime.cpu import HandlerTimeout, ProcessPool


async def test_a_handler_module_past_the_import_limit_is_not_called_a_slow_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker stuck importing the handler's module says so, not that the handler overran.

    It said the handler "ran past its 30.0s limit", sending its reader to the handler's own work
    when the handler had never begun: its module's import had hung.
    """
    monkeypatch.setattr(cpu, "_IMPORT_LIMIT_S", 1.0)
    pool = ProcessPool(1, grace_s=0.5)
    try:
        with pytest.raises(HandlerTimeout) as raised:
            await pool.run("runtime.slow_import_app:never", ("x",), 30.0)
    finally:
        await pool.close()
    message = str(raised.value)
    assert "ran past" not in message
    assert "runtime.slow_import_app" in message
    assert "import" in message
    assert "\n" not in message
