"""The public error tree: names, messages, pickling, and TaskError's dual inheritance."""

from __future__ import annotations

import errno
import importlib
import os
import pickle
import sys
import threading
from typing import Any

import cloudpickle
import pytest

import nbcluster._runtime.exceptions as runtime_exc_mod
import nbcluster.exceptions as exc_mod
from nbcluster._runtime.exceptions import base as _error_base
from nbcluster._runtime.exceptions import task as _task_errors
from nbcluster._runtime.exceptions.base import _truncate_traceback
from nbcluster.exceptions import (
    MAX_TRACEBACK_BYTES,
    ActorDiedError,
    ActorError,
    ActorUnavailableError,
    ActorUnschedulableError,
    AuthenticationError,
    GetTimeoutError,
    HeadUnavailableError,
    InfeasibleResourceWarning,
    LocalNodeDiedError,
    NbclusterError,
    NbclusterSystemError,
    NodeDiedError,
    ObjectFetchTimedOutError,
    ObjectFreedError,
    ObjectLostError,
    ObjectReconstructionFailedError,
    ObjectReconstructionFailedLineageEvictedError,
    ObjectReconstructionFailedMaxAttemptsExceededError,
    ObjectStoreFullError,
    OutOfDiskError,
    OutOfMemoryError,
    OwnerDiedError,
    PendingCallsLimitExceeded,
    PendingTasksLimitExceeded,
    ReferenceCountingAssertionError,
    RuntimeEnvSetupError,
    SerializationError,
    TaskCancelledError,
    TaskError,
    TaskUnschedulableError,
    UnserializableException,
    WorkerCrashedError,
)

# --------------------------------------------------------------------------- helpers


def raise_and_wrap(exc: BaseException, function_name: str = "mod.f", **where: Any) -> TaskError:
    """Raise ``exc`` so it has a traceback, then wrap it as the worker would."""
    try:
        raise exc
    except BaseException as e:  # wrap whatever user code raised
        return TaskError.from_exception(e, function_name, **where)


def roundtrip(obj: Any) -> Any:
    return cloudpickle.loads(cloudpickle.dumps(obj))


class CustomError(Exception):
    """A user exception with extra attributes and an __init__ that must not be re-run."""

    init_calls = 0

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message, code)
        type(self).init_calls += 1
        self.code = code


class FinalError(Exception):
    """An exception class that refuses to be subclassed."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError("FinalError is final")


class TwoArgError(Exception):
    """Pickles, but cannot be unpickled: __init__ needs two arguments, args holds one."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(a)
        self.b = b


class HoldsLockError(Exception):
    """Cannot be pickled: holds a lock."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


# --------------------------------------------------------------------------- the surface


def test_all_lists_every_public_class_with_a_docstring() -> None:
    public = {
        name
        for name, obj in vars(exc_mod).items()
        if isinstance(obj, type)
        and issubclass(obj, BaseException)
        and obj.__module__ == exc_mod.__name__
        and not name.startswith("_")
    }
    assert public == set(exc_mod.__all__)
    for name in exc_mod.__all__:
        assert getattr(exc_mod, name).__doc__, name


def test_all_is_the_runtime_error_list_under_the_public_module() -> None:
    assert exc_mod.__all__ == [n for n in runtime_exc_mod.__all__ if n != "MAX_TRACEBACK_BYTES"]
    for name in exc_mod.__all__:
        cls = getattr(exc_mod, name)
        assert cls is getattr(runtime_exc_mod, name)
        assert cls.__module__ == "nbcluster.exceptions", name
    assert exc_mod.MAX_TRACEBACK_BYTES == runtime_exc_mod.MAX_TRACEBACK_BYTES


def test_a_new_runtime_error_is_public_without_a_second_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class BrandNewError(NbclusterError):
        """A future error type, added only to the runtime's list."""

    monkeypatch.setattr(runtime_exc_mod, "BrandNewError", BrandNewError, raising=False)
    monkeypatch.setattr(runtime_exc_mod, "__all__", [*runtime_exc_mod.__all__, "BrandNewError"])
    try:
        importlib.reload(exc_mod)
        assert "BrandNewError" in exc_mod.__all__
        assert exc_mod.BrandNewError is BrandNewError  # type: ignore[attr-defined]
    finally:
        monkeypatch.undo()
        vars(exc_mod).pop("BrandNewError", None)
        importlib.reload(exc_mod)
    assert "BrandNewError" not in exc_mod.__all__


@pytest.mark.parametrize("name", [n for n in exc_mod.__all__ if n != "InfeasibleResourceWarning"])
def test_every_error_is_an_nbcluster_error(name: str) -> None:
    assert issubclass(getattr(exc_mod, name), NbclusterError)


def test_hierarchy_mirrors_ray() -> None:
    assert issubclass(ActorDiedError, ActorError)
    assert issubclass(ActorUnavailableError, ActorError)
    for cls in (
        OwnerDiedError,
        ObjectReconstructionFailedError,
        ObjectFetchTimedOutError,
        ObjectFreedError,
        ReferenceCountingAssertionError,
    ):
        assert issubclass(cls, ObjectLostError)
    assert issubclass(ObjectReconstructionFailedMaxAttemptsExceededError, ObjectLostError)
    assert issubclass(
        ObjectReconstructionFailedLineageEvictedError, ObjectReconstructionFailedError
    )
    assert issubclass(ReferenceCountingAssertionError, AssertionError)
    assert issubclass(GetTimeoutError, TimeoutError)
    assert issubclass(SerializationError, TypeError)
    assert issubclass(HeadUnavailableError, ConnectionError)
    assert issubclass(InfeasibleResourceWarning, UserWarning)


# --------------------------------------------------------------------------- pickling

SAMPLES: list[BaseException] = [
    NbclusterError("plain"),
    TaskError("f", "Traceback...\nValueError: x\n", ValueError("x"), pid=1, hostname="h"),
    UnserializableException("tb text", exception_type="Weird", reason="no pickle"),
    WorkerCrashedError(task_id="t1", pid=42, node_id="n1", exit_detail="SIGKILL"),
    TaskCancelledError("t9"),
    TaskCancelledError(),
    ActorError(actor_id="a1"),
    ActorDiedError("a1", reason="killed", class_name="Counter", name="c", pid=3),
    ActorDiedError.from_task_error(
        TaskError("Counter.__init__", "Traceback\nZeroDivisionError: boom\n", None),
        actor_id="a2",
    ),
    ActorUnavailableError(actor_id="a3", reason="restarting"),
    PendingCallsLimitExceeded(actor_id="a4", max_pending_calls=10),
    PendingTasksLimitExceeded(limit=1000),
    ObjectLostError("ff00", "node died", owner_address="owner:1", call_site="file.py:3"),
    OwnerDiedError("ff01", owner_address="10.0.0.1:555"),
    ObjectReconstructionFailedError("ff02"),
    ObjectReconstructionFailedMaxAttemptsExceededError("ff03"),
    ObjectReconstructionFailedLineageEvictedError("ff04"),
    ObjectFetchTimedOutError("ff05"),
    ObjectFreedError("ff06"),
    ReferenceCountingAssertionError("ff07"),
    ObjectStoreFullError(requested_bytes=10, capacity_bytes=100, used_bytes=95, node_id="n"),
    OutOfDiskError(path="/spill", node_id="n"),
    OutOfMemoryError(task_id="t", node_id="n", memory_used_bytes=9, memory_total_bytes=10),
    GetTimeoutError(timeout=1.5, num_pending=2),
    NodeDiedError(node_id="n2", address="10.0.0.2:7", reason="no heartbeat"),
    LocalNodeDiedError(),
    HeadUnavailableError(address="127.0.0.1:6379", grace_period_s=30),
    TaskUnschedulableError(name="f", resources={"GPU": 1}),
    ActorUnschedulableError("no node has TPU", name="A"),
    RuntimeEnvSetupError("pip failed"),
    AuthenticationError(address="127.0.0.1:1", token_missing=True),
    SerializationError("cannot pickle '_thread.lock'", object_path="args[0]['lock']"),
    NbclusterSystemError("node manager killed", "tb"),
]


@pytest.mark.parametrize("err", SAMPLES, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("dumps", [cloudpickle.dumps, pickle.dumps], ids=["cloudpickle", "pickle"])
def test_every_error_round_trips_with_its_attributes(err: BaseException, dumps: Any) -> None:
    back = pickle.loads(dumps(err))
    assert type(back) is type(err)
    assert back.args == err.args or type(err) is TaskError  # cause compares by identity
    assert str(back) == str(err)
    assert set(vars(back)) == set(vars(err))
    for key, value in vars(err).items():
        if isinstance(value, BaseException):
            assert type(vars(back)[key]) is type(value)
            assert str(vars(back)[key]) == str(value)
        else:
            assert vars(back)[key] == value, key


@pytest.mark.parametrize("err", SAMPLES, ids=lambda e: type(e).__name__)
def test_every_error_has_a_message_and_a_repr(err: BaseException) -> None:
    assert str(err).strip()
    assert repr(err)


# --------------------------------------------------------------------------- TaskError


def test_from_exception_records_the_traceback_and_where() -> None:
    err = raise_and_wrap(ValueError("bad value"), "mod.f", node_id="n1", task_id="t1")
    assert err.function_name == "mod.f"
    assert err.pid == os.getpid()
    assert err.hostname
    assert (err.node_id, err.task_id) == ("n1", "t1")
    assert type(err.cause) is ValueError
    assert err.traceback_str.startswith("Traceback (most recent call last):")
    assert err.traceback_str.rstrip().endswith("ValueError: bad value")
    assert "raise_and_wrap" in err.traceback_str


def test_str_shows_function_where_and_remote_traceback() -> None:
    err = TaskError(
        "mod.f",
        "Traceback (most recent call last):\n  File 'x.py', line 1, in f\nValueError: x\n",
        ValueError("x"),
        pid=123,
        hostname="box",
        node_id="n1",
    )
    assert str(err) == (
        "mod.f raised an exception (pid=123, host=box, node=n1):\n"
        "Traceback (most recent call last):\n  File 'x.py', line 1, in f\nValueError: x"
    )
    assert repr(err) == "TaskError(function_name='mod.f', cause=ValueError('x'))"


def test_as_instanceof_cause_is_both_task_error_and_the_cause_class() -> None:
    dual = raise_and_wrap(ValueError("x")).as_instanceof_cause()
    assert isinstance(dual, TaskError)
    assert isinstance(dual, ValueError)
    assert type(dual).__name__ == "TaskError(ValueError)"
    assert type(dual).__qualname__ == "TaskError(ValueError)"
    assert dual.args == ("x",)
    assert str(dual).startswith("mod.f raised an exception (pid=")
    assert repr(dual).startswith("TaskError(ValueError)(function_name='mod.f'")
    with pytest.raises(ValueError, match=r"ValueError: x"):
        raise dual
    # One class per cause class; asking again is a no-op.
    assert type(raise_and_wrap(ValueError("y")).as_instanceof_cause()) is type(dual)
    assert dual.as_instanceof_cause() is dual


def test_dual_keeps_user_attributes_without_running_user_init() -> None:
    err = raise_and_wrap(CustomError("boom", code=7))
    calls = CustomError.init_calls
    dual = err.as_instanceof_cause()
    assert CustomError.init_calls == calls
    assert isinstance(dual, CustomError)
    assert dual.code == 7
    assert dual.args == ("boom", 7)
    assert dual.cause is err.cause


def test_dual_keeps_builtin_slot_attributes() -> None:
    err = raise_and_wrap(FileNotFoundError(errno.ENOENT, "No such file", "/nope"))
    dual = err.as_instanceof_cause()
    assert type(dual).__name__ == "TaskError(FileNotFoundError)"
    assert isinstance(dual, FileNotFoundError)
    assert (dual.errno, dual.strerror, dual.filename) == (errno.ENOENT, "No such file", "/nope")
    back = roundtrip(dual)
    assert type(back) is type(dual)
    assert (back.errno, back.filename) == (errno.ENOENT, "/nope")


class SlotsError(Exception):
    __slots__ = ("detail",)

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def __reduce__(self) -> Any:
        return (SlotsError, (self.detail,))


def test_dual_keeps_user_slots() -> None:
    dual = raise_and_wrap(SlotsError("in a slot")).as_instanceof_cause()
    assert type(dual).__name__ == "TaskError(SlotsError)"
    assert dual.detail == "in a slot"
    assert roundtrip(dual).detail == "in a slot"


def test_dual_of_key_error_keeps_the_key() -> None:
    dual = raise_and_wrap(KeyError("missing")).as_instanceof_cause()
    assert isinstance(dual, KeyError)
    assert dual.args == ("missing",)


@pytest.mark.parametrize("dumps", [cloudpickle.dumps, pickle.dumps], ids=["cloudpickle", "pickle"])
def test_dual_round_trips_as_a_dual(dumps: Any) -> None:
    dual = raise_and_wrap(CustomError("boom", code=3), pid=5, hostname="h").as_instanceof_cause()
    back = pickle.loads(dumps(dual))
    assert type(back) is type(dual)
    assert isinstance(back, CustomError)
    assert isinstance(back, TaskError)
    assert (back.code, back.pid, back.hostname) == (3, 5, "h")
    assert str(back) == str(dual)
    assert type(back.cause) is CustomError


def test_dual_of_a_class_defined_in_a_function_round_trips() -> None:
    class LocalError(Exception):  # pickled by value, like a class defined in a notebook cell
        pass

    dual = raise_and_wrap(LocalError("in a cell")).as_instanceof_cause()
    back = roundtrip(dual)
    assert isinstance(back, LocalError)
    assert isinstance(back, TaskError)
    assert type(back).__name__ == "TaskError(LocalError)"


def test_dual_is_rebuilt_by_a_module_level_function() -> None:
    dual = raise_and_wrap(ValueError("x")).as_instanceof_cause()
    rebuild, (plain,) = dual.__reduce__()
    assert rebuild is _task_errors._rebuild_dual
    assert type(plain) is TaskError


@pytest.mark.parametrize(
    "cause",
    [
        FinalError("cannot subclass"),
        KeyboardInterrupt(),
        SystemExit(3),
        GetTimeoutError(timeout=1),
        None,
    ],
    ids=["final-class", "KeyboardInterrupt", "SystemExit", "nbcluster-error", "no-cause"],
)
def test_as_instanceof_cause_falls_back_to_plain_task_error(cause: BaseException | None) -> None:
    err = TaskError("f", "tb", cause)
    assert err.as_instanceof_cause() is err


def test_nested_task_error_takes_the_innermost_user_cause() -> None:
    inner = raise_and_wrap(ValueError("deep"), "inner").as_instanceof_cause()
    outer = raise_and_wrap(inner, "outer")
    assert outer.cause is not None
    dual = outer.as_instanceof_cause()
    assert isinstance(dual, ValueError)
    assert dual.function_name == "outer"
    assert "ValueError: deep" in str(dual)


def test_unpicklable_exception_becomes_unserializable_exception_with_traceback() -> None:
    err = raise_and_wrap(HoldsLockError("locked"))
    cause = err.cause
    assert type(cause) is UnserializableException
    assert cause.exception_type == "HoldsLockError"
    assert "HoldsLockError: locked" in cause.original_stack_trace
    assert cause.original_stack_trace == err.traceback_str
    # One error layer: the TaskError is never wrapped again, and it pickles.
    assert err.as_instanceof_cause() is err
    back = roundtrip(err)
    assert type(back.cause) is UnserializableException
    assert "HoldsLockError: locked" in str(back)
    assert str(back).count("HoldsLockError: locked") == 1
    assert "cannot be pickled" in str(back)
    assert str(cause).startswith("The task raised HoldsLockError, which could not be sent back")


def test_exception_that_cannot_be_unpickled_is_replaced() -> None:
    err = raise_and_wrap(TwoArgError("a", "b"))
    assert type(err.cause) is UnserializableException
    assert "TwoArgError: a" in err.cause.original_stack_trace


def test_self_referential_exception_gives_one_error_layer() -> None:
    loop = ValueError("loop")
    loop.args = (loop,)
    err = raise_and_wrap(loop)
    assert type(err.cause) is UnserializableException
    assert not isinstance(err.cause, TaskError)
    assert type(roundtrip(err)) is TaskError


def test_long_traceback_is_truncated_to_64_kib_keeping_head_and_tail() -> None:
    err = raise_and_wrap(ValueError("x" * 200_000 + "END"))
    tb = err.traceback_str
    assert len(tb.encode()) <= MAX_TRACEBACK_BYTES
    assert tb.startswith("Traceback (most recent call last):")
    assert tb.rstrip().endswith("END")
    assert " bytes truncated ..." in tb


def _ping(n: int) -> int:
    return _pong(n + 1)


def _pong(n: int) -> int:
    return _ping(n + 1)


def test_unbounded_recursion_gives_a_truncated_recursion_error() -> None:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(2000)
    try:
        try:
            _ping(0)
        except RecursionError as e:
            err = TaskError.from_exception(e, "_ping")
    finally:
        sys.setrecursionlimit(limit)
    assert isinstance(err.as_instanceof_cause(), RecursionError)
    tb = err.traceback_str
    assert len(tb.encode()) <= MAX_TRACEBACK_BYTES
    assert " bytes truncated ..." in tb
    assert tb.rstrip().splitlines()[-1].startswith("RecursionError: maximum recursion depth")
    assert type(roundtrip(err)) is TaskError


def test_truncate_accounts_for_every_byte() -> None:
    text = "".join(f"line {i}: {'é' * 30}\n" for i in range(10_000))
    out = _truncate_traceback(text, limit=4096)
    assert len(out.encode()) <= 4096
    head, rest = out.split("\n... ", 1)
    omitted_str, tail = rest.split(" bytes truncated ...\n", 1)
    assert text.startswith(head)
    assert text.endswith(tail)
    assert len(head.encode()) + int(omitted_str) + len(tail.encode()) == len(text.encode())
    assert _truncate_traceback("short") == "short"


def test_leading_runtime_frames_are_dropped_from_the_traceback() -> None:
    fake = os.path.join(_error_base._RUNTIME_DIR, "worker", "executor.py")
    namespace: dict[str, Any] = {}
    src = "def run(fn):\n    try:\n        fn()\n    except Exception as e:\n        return e\n"
    exec(compile(src, fake, "exec"), namespace)

    def user_code() -> None:
        raise ValueError("user")

    exc = namespace["run"](user_code)
    tb = TaskError.from_exception(exc, "user_code").traceback_str
    assert "executor.py" not in tb
    assert "in user_code" in tb


def test_where_defaults_can_be_overridden() -> None:
    err = raise_and_wrap(ValueError(), pid=7, hostname="remote-host")
    assert (err.pid, err.hostname) == (7, "remote-host")


# --------------------------------------------------------------------------- messages


def test_actor_init_failure_message() -> None:
    creation = raise_and_wrap(ZeroDivisionError("boom"), "Counter.__init__")
    err = ActorDiedError.from_task_error(creation, actor_id="a1", class_name="Counter")
    assert err.actor_init_failed
    assert err.cause is creation
    assert err.actor_id == "a1"
    assert isinstance(err, ActorError)
    with pytest.raises(
        ActorDiedError,
        match=r"^The actor died because of an error raised in its creation task "
        r"\(class=Counter, actor_id=a1, pid=\d+, host=[^)]+\)\. Every call to this actor fails; "
        r"fix __init__ and create a new actor\.\nCounter\.__init__ raised an exception",
    ):
        raise err
    assert "ZeroDivisionError: boom" in str(err)


def test_actor_died_message_says_how_to_survive() -> None:
    err = ActorDiedError("a1", reason="the process exited with code 1")
    assert not err.actor_init_failed
    assert str(err) == (
        "The actor died unexpectedly before finishing this task (actor_id=a1). "
        "Reason: the process exited with code 1. To survive process crashes, create the actor "
        "with max_restarts=N (and max_task_retries=N to retry calls that were running); check "
        "the actor's worker log for the cause."
    )


def test_object_store_full_message_says_what_to_do() -> None:
    err = ObjectStoreFullError(
        requested_bytes=3 * 2**20, capacity_bytes=100 * 2**20, used_bytes=99 * 2**20
    )
    with pytest.raises(
        ObjectStoreFullError,
        match=r"^The object store is full \(99\.0 MiB of 100\.0 MiB in use\) and cannot fit an "
        r"object of 3\.0 MiB after evicting every object that nobody references\.\n"
        r"Tip: delete ObjectRefs you no longer need \(`del ref`\).*object_store_memory.*spill",
    ):
        raise err
    off = str(ObjectStoreFullError(spilling_enabled=False))
    assert "NBCLUSTER_SPILLING_ENABLED=1" in off


def test_authentication_error_explains_the_token_and_never_shows_it() -> None:
    err = AuthenticationError(address="10.0.0.1:6379")
    with pytest.raises(
        AuthenticationError,
        match=r"^The cluster at 10\.0\.0\.1:6379 refused the request: the token was not "
        r"accepted\. .*NBCLUSTER_TOKEN .*NBCLUSTER_TOKEN_FILE",
    ):
        raise err
    assert "no token was sent" in str(AuthenticationError(token_missing=True))
    told = "the head refused the call: set NBCLUSTER_TOKEN."
    assert str(AuthenticationError(told)) == told


def test_get_timeout_error_says_the_task_keeps_running() -> None:
    with pytest.raises(
        TimeoutError,
        match=r"^get\(\) timed out after 0\.5s \(1 object not ready\)\. The tasks keep running",
    ):
        raise GetTimeoutError(timeout=0.5, num_pending=1)
    assert str(GetTimeoutError("custom")) == "custom"


def test_worker_crashed_message_mentions_max_retries() -> None:
    err = WorkerCrashedError(pid=99, node_id="n1")
    assert str(err).startswith(
        "The worker process died unexpectedly while running this task (pid=99, node=n1)."
    )
    assert "max_retries" in str(err)


def test_task_cancelled_error() -> None:
    assert str(TaskCancelledError()) == (
        "This task or one of its dependencies was cancelled. "
        "Cancelled tasks are not retried; submit it again to rerun."
    )
    assert str(TaskCancelledError("t1")).startswith("Task t1 was cancelled.")
    assert TaskCancelledError("t1").task_id == "t1"


def test_object_lost_messages_name_the_object_and_the_reason() -> None:
    err = ObjectReconstructionFailedMaxAttemptsExceededError("abc", call_site="cell 3, line 2")
    assert str(err).startswith("Failed to retrieve object abc. The ObjectRef was created at:\n")
    assert "max_retries" in str(err)
    lost = ObjectLostError("abc", "the object is no longer in the node's store")
    assert str(lost).startswith(
        "Failed to retrieve object abc: the object is no longer in the node's store.\n\n"
        "All copies of abc were lost"
    )
    assert lost.reason == "the object is no longer in the node's store"
    owner = str(OwnerDiedError("abc", owner_address="10.0.0.1:1"))
    assert "The object's owner (10.0.0.1:1) has exited." in owner


def test_head_unavailable_error_keeps_the_kernel() -> None:
    err = HeadUnavailableError(address="127.0.0.1:1", grace_period_s=30.0)
    assert str(err).startswith("The cluster head at 127.0.0.1:1 could not be reached for 30s.")
    assert "nbcluster.init(address=...)" in str(err)


def test_serialization_error_names_the_object_path() -> None:
    err = SerializationError("Could not pickle argument 0", object_path="args[0]['lock']")
    with pytest.raises(TypeError, match=r"^Could not pickle argument 0\n.*args\[0\]\['lock'\]$"):
        raise err


def test_unschedulable_messages() -> None:
    msg = str(TaskUnschedulableError(name="f", resources={"GPU": 1.0}))
    assert msg.startswith(
        "The task f cannot be scheduled: no node in the cluster has the resources it requests."
        " It requests {'GPU': 1.0}."
    )
    assert str(ActorUnschedulableError("x")).startswith("The actor cannot be scheduled: x.")


def test_pending_calls_limit_message() -> None:
    msg = str(PendingCallsLimitExceeded(actor_id="a1", max_pending_calls=10))
    assert msg.startswith("The actor a1 already has as many pending calls as it accepts")
    assert "max_pending_calls=10" in msg
