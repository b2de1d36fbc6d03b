"""Serialization of values for the cluster: one pickle stream plus out-of-band buffers.

``serialize(value)`` pickles with pickle protocol 5 so that numpy arrays (and any other
``PickleBuffer``) stay *out of band*: the pickle stream only describes them and their
bytes are written, once, straight from the caller's memory into the destination (the
object store file or an inline ``bytes``). ``deserialize`` maps them back as memoryview
slices of the source, so a value read from a read-only store mapping gives read-only numpy
arrays that share that memory: no copy at all.

Encoding (little-endian), produced by :meth:`SerializedValue.write_into`,
:meth:`SerializedValue.to_bytes` and :meth:`SerializedValue.chunks`::

    0   magic  b"NBC1"             4 bytes
    4   version (1)                u8
    5   flags (0)                  u8
    6   reserved (0)               u16
    8   nbuf                       u32   number of out-of-band buffers
    12  table: (nbuf + 1) x (offset u64, length u64)
            entry 0 is the pickle stream, entries 1..nbuf the buffers in pickle order
    ..  pickle stream              starts right after the table
    ..  buffer i                   starts at a 64-byte-aligned offset; the gaps are zeros

When ``nbuf`` is 0 there is no table: the pickle stream is everything after the 12-byte
header, so the header of every value without buffers is the same constant (this saves a
``struct`` pack and unpack on the inline hot path). Buffers under ``OOB_MIN_BYTES`` are
kept in band (their table entry and padding would cost more than they save); arrays that
small come back as private writable copies.

Hot path choices (measured on the 2-vCPU dev machine, Python 3.11, min of 5 runs):

* ``pickle.dumps(5)`` + ``loads``: 0.33 us; ``cloudpickle.dumps(5)`` alone: 1.9 us,
  nearly all of it the cost of building its ``Pickler``. Values whose type is a builtin
  scalar (or a small flat list/tuple/dict of them) therefore use plain ``pickle``: for
  those types both picklers emit the same stream, and none of them can refer to
  ``__main__``. Everything else goes through cloudpickle (functions, closures, lambdas and
  classes defined in a notebook must be pickled by value, which plain pickle does not do).
  ``serialize(5).to_bytes()`` + ``deserialize``: 0.95-1.1 us against 0.33-0.37 us for
  plain pickle (2.6-3x; the machine is shared and noisy). The difference is CPython's
  cost of four calls and one object, which the API needs: a bare prototype of the same
  shape (no error handling, no refs) measured 0.85 us.
* The C pickler recurses on the C stack. With the default recursion limit a deeply nested
  value raises ``RecursionError`` (reported as :class:`SerializationError`); when the
  process raised ``sys.setrecursionlimit`` above what an 8 MiB stack can hold (Python
  3.11 then segfaults at about 20,000 levels of nested objects, 45,000 of lists),
  pickling runs in a helper thread whose stack is sized for the limit.

Object references: ``ObjectRef.__reduce__`` calls :func:`note_contained_ref`; during
``serialize`` this appends the ref to :attr:`SerializedValue.contained_refs` (outside
``serialize`` it does nothing). On the way back, the function that rebuilds a ref calls
:func:`_ref_deserialized` with the new ref; that calls the hook the core client installed
with :func:`register_ref_deserializer_hook`. ``deserialize(data, context=x)`` makes
``x`` available to that code through :func:`current_deserialize_context`, so a process
with two clients can tell which one is deserializing.
"""

from __future__ import annotations

import collections
import hashlib
import io
import pickle
import struct
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import cloudpickle

from nbcluster._runtime.exceptions import SerializationError

__all__ = [
    "ALIGNMENT",
    "MAGIC",
    "OOB_MIN_BYTES",
    "VERSION",
    "SerializedValue",
    "current_deserialize_context",
    "deserialize",
    "function_hash",
    "make_pickler",
    "note_contained_ref",
    "register_plain_type",
    "register_reducer",
    "register_ref_deserializer_hook",
    "serialize",
    "unregister_reducer",
]

MAGIC = b"NBC1"
VERSION = 1
#: Out-of-band buffers start at multiples of this many bytes in the encoding.
ALIGNMENT = 64
#: ``PickleBuffer`` objects smaller than this are kept inside the pickle stream.
OOB_MIN_BYTES = 512
PICKLE_PROTOCOL = 5

_HEADER = struct.Struct("<4sBBHI")
_ENTRY = struct.Struct("<QQ")
#: The whole header of a value without out-of-band buffers; its pickle follows.
_PLAIN_HEADER = _HEADER.pack(MAGIC, VERSION, 0, 0, 0)
_PLAIN_OFFSET = _HEADER.size
_ZEROS = bytes(ALIGNMENT)
_dumps = pickle.dumps
_loads = pickle.loads

# Exact types for which plain pickle and cloudpickle produce the same stream.
# Types the C pickler writes alone (no ObjectRef, buffer or closure inside), so a value made
# of them skips cloudpickle; extended by ``register_plain_type``.
_PLAIN_TYPES = {int, float, str, bytes, bool, type(None), complex}
_PLAIN_CONTAINERS = frozenset({tuple, list, dict})
_PLAIN_MAX_ITEMS = 16

# Above this recursion limit the C pickler could overflow an 8 MiB thread stack; measured
# worst case is ~440 bytes of C stack per level of object nesting (Python 3.11).
_SAFE_RECURSION_LIMIT = 12_000
_STACK_BYTES_PER_LEVEL = 1024
_MAX_HELPER_STACK = 1 << 30

_DEFAULT_HINT = "Pass something picklable, or create it inside the task."
_GENERATOR_HINT = "Turn it into a list first (list(...)), or create it inside the task."
_MAX_WALK_DEPTH = 64
_MAX_WALK_SECONDS = 2.0

_tls = threading.local()
_on_ref_deserialized: Callable[[object], None] | None = None
#: ``cls -> reduce function`` registered by ``nbcluster.util.register_serializer`` (this
#: process only, as in Ray: the deserializer travels inside each value).
_custom_reducers: dict[type, Callable[[Any], Any]] = {}


def register_reducer(cls: type, reducer: Callable[[Any], Any]) -> None:
    """Pickle instances of exactly ``cls`` with ``reducer(obj)`` (a ``__reduce__`` result)."""
    _custom_reducers[cls] = reducer


def unregister_reducer(cls: type) -> None:
    """Forget the reducer of ``cls`` (nothing happens when there is none)."""
    _custom_reducers.pop(cls, None)


def _reduce_code_keeping_filename(code: types.CodeType) -> Any:
    """cloudpickle's reducer for code objects, but keeping ``co_filename``.

    cloudpickle 3.1.3 replaces the file name of every function pickled by value with
    ``"<dynamic-code>"`` (for deterministic payloads). A task's traceback then names no
    file and shows no source line, and the notebook loses the cell a failing line came
    from; tracebacks matter more to us than byte-identical payloads across directories.
    """
    rebuild, args = _cloudpickle_code_reduce(code)
    return rebuild, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)


_cloudpickle_code_reduce = cloudpickle.Pickler.dispatch_table[types.CodeType]
_code_reducers: dict[type, Callable[[Any], Any]] = {types.CodeType: _reduce_code_keeping_filename}


class _Pickler(cloudpickle.Pickler):
    # Read by the C pickler when it is made; the ChainMap sees later registrations.
    dispatch_table = collections.ChainMap(
        _custom_reducers, _code_reducers, cloudpickle.Pickler.dispatch_table
    )


def make_pickler(
    file: Any, buffer_callback: Callable[[pickle.PickleBuffer], Any] | None = None
) -> Any:
    """The cloudpickle pickler every value goes through, with the registered reducers."""
    return _Pickler(file, protocol=PICKLE_PROTOCOL, buffer_callback=buffer_callback)


def dumps_code(obj: object) -> bytes:
    """Pickle a function or class by value for the function table (``cloudpickle.dumps``
    with the file names kept, so tracebacks show source lines)."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=PICKLE_PROTOCOL).dump(obj)
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# the serialized form


class SerializedValue:
    """A pickled value: its pickle stream (``meta``) and its out-of-band ``buffers``.

    Nothing is copied until :meth:`write_into`, :meth:`to_bytes` or :meth:`chunks` is used;
    the buffers are views of the original objects, so the value must not be mutated before
    it is written.
    """

    __slots__ = ("meta", "buffers", "contained_refs", "total_size", "_offsets")

    meta: bytes
    #: Contiguous byte views (format ``"B"``) of the out-of-band buffers.
    buffers: Sequence[memoryview]
    #: The ``ObjectRef`` objects pickled inside this value (see ``note_contained_ref``).
    contained_refs: Sequence[object]
    #: Size in bytes of the encoded form.
    total_size: int

    def __init__(
        self,
        meta: bytes,
        buffers: Sequence[memoryview] = (),
        contained_refs: Sequence[object] = (),
    ) -> None:
        self.meta = meta
        self.buffers = buffers
        self.contained_refs = contained_refs
        if not buffers:
            self._offsets: Sequence[int] = ()
            self.total_size = _PLAIN_OFFSET + len(meta)
            return
        pos = _HEADER.size + _ENTRY.size * (len(buffers) + 1) + len(meta)
        offsets = []
        for buf in buffers:
            pos = (pos + ALIGNMENT - 1) & ~(ALIGNMENT - 1)
            offsets.append(pos)
            pos += buf.nbytes
        self._offsets = offsets
        self.total_size = pos

    def __repr__(self) -> str:
        return (
            f"<SerializedValue {self.total_size} bytes, {len(self.buffers)} buffers, "
            f"{len(self.contained_refs)} refs>"
        )

    def _head(self) -> bytes:
        """Header and table: everything before the pickle stream."""
        buffers = self.buffers
        if not buffers:
            return _PLAIN_HEADER
        meta_off = _HEADER.size + _ENTRY.size * (len(buffers) + 1)
        table = [meta_off, len(self.meta)]
        for off, buf in zip(self._offsets, buffers, strict=True):
            table += (off, buf.nbytes)
        return _HEADER.pack(MAGIC, VERSION, 0, 0, len(buffers)) + struct.pack(
            f"<{len(table)}Q", *table
        )

    def chunks(self) -> list[bytes | memoryview]:
        """The encoding as consecutive pieces (for ``os.pwritev``): no gaps, no copies."""
        head = self._head()
        out: list[bytes | memoryview] = [head, self.meta]
        pos = len(head) + len(self.meta)
        zeros = memoryview(_ZEROS)
        for off, buf in zip(self._offsets, self.buffers, strict=True):
            if off > pos:
                out.append(zeros[: off - pos])
            out.append(buf)
            pos = off + buf.nbytes
        return out

    def to_bytes(self) -> bytes:
        """The encoding as one ``bytes`` object (for values sent inline)."""
        if not self.buffers:
            return _PLAIN_HEADER + self.meta
        return b"".join(self.chunks())

    def write_into(self, dest: memoryview) -> None:
        """Write the encoding into ``dest``, a writable buffer of exactly ``total_size`` bytes."""
        if dest.format != "B" or dest.ndim != 1:
            dest = dest.cast("B")
        if dest.nbytes != self.total_size:
            raise ValueError(f"destination has {dest.nbytes} bytes, need {self.total_size}")
        pos = 0
        for chunk in self.chunks():
            n = len(chunk) if isinstance(chunk, bytes) else chunk.nbytes
            dest[pos : pos + n] = chunk
            pos += n


class _PlainValue(SerializedValue):
    """A value from the plain-pickle fast path: no buffers, no refs, minimal construction."""

    __slots__ = ()
    buffers = ()  # type: ignore[assignment]
    contained_refs = ()  # type: ignore[assignment]
    _offsets = ()  # type: ignore[assignment]

    def __init__(self, meta: bytes) -> None:
        self.meta = meta
        self.total_size = _PLAIN_OFFSET + len(meta)

    def to_bytes(self) -> bytes:
        """The encoding as one ``bytes`` object."""
        return _PLAIN_HEADER + self.meta


# --------------------------------------------------------------------------------------------
# serialize


def serialize(value: object, *, what: str = "value", name: str = "value") -> SerializedValue:
    """Pickle ``value`` (protocol 5, buffers out of band) without copying its buffers.

    ``what`` and ``name`` only shape the error message: ``what`` says what was being sent
    (``"argument"``, ``"return value"``, ...) and ``name`` is the root of the reported path
    (``args``, the function's name, ...).

    Raises :class:`nbcluster.exceptions.SerializationError` (a ``TypeError``) naming the
    innermost part of ``value`` that cannot be pickled.
    """
    t = type(value)
    if t in _PLAIN_TYPES or (t in _PLAIN_CONTAINERS and _plain_items(value, t)):
        return _PlainValue(_dumps(value, PICKLE_PROTOCOL))
    if sys.getrecursionlimit() > _SAFE_RECURSION_LIMIT:
        return _call_with_large_stack(_serialize_slow, value, what, name)
    return _serialize_slow(value, what, name)


def register_plain_type(cls: type) -> None:
    """Let values of ``cls`` take the fast path of :func:`serialize` (the C pickler alone).

    Only for a class importable by name whose instances hold nothing but plain values
    (no ``ObjectRef``, buffer, function or lambda): the runtime's own small records, such
    as the placeholders of a call's ref arguments (``core.args``).
    """
    _PLAIN_TYPES.add(cls)


def _plain_items(value: Any, t: type, depth: int = 2) -> bool:
    """True if a small list/tuple/dict holds only ``_PLAIN_TYPES``, or such containers
    nested at most ``depth`` levels (so a task's ``(args, kwargs)`` takes the fast path)."""
    if len(value) > _PLAIN_MAX_ITEMS:
        return False
    plain = _PLAIN_TYPES
    containers = _PLAIN_CONTAINERS
    # Loops, not all(): a generator costs more than the check itself here.
    if t is dict:
        for k, v in value.items():
            if type(k) not in plain:
                return False
            tv = type(v)
            if tv not in plain and not (
                depth and tv in containers and _plain_items(v, tv, depth - 1)
            ):
                return False
        return True
    for x in value:
        tx = type(x)
        if tx not in plain and not (depth and tx in containers and _plain_items(x, tx, depth - 1)):
            return False
    return True


def _serialize_slow(value: object, what: str, name: str) -> SerializedValue:
    refs: list[object] = []
    buffers: list[memoryview] = []

    def keep_out_of_band(pb: pickle.PickleBuffer) -> bool:
        raw = pb.raw()
        if raw.nbytes < OOB_MIN_BYTES:
            return True  # a true result means "serialize in band"
        buffers.append(raw)
        return False

    previous = getattr(_tls, "refs", None)
    _tls.refs = refs
    try:
        with io.BytesIO() as file:
            make_pickler(file, keep_out_of_band).dump(value)
            meta = file.getvalue()
    except Exception as exc:  # noqa: BLE001 - any failure while pickling means "not serializable"
        raise _serialization_error(value, exc, what, name) from None
    finally:
        _tls.refs = previous
    return SerializedValue(meta, buffers, refs)


def _call_with_large_stack(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)`` in a helper thread whose C stack fits the recursion limit."""
    stack = min(sys.getrecursionlimit() * _STACK_BYTES_PER_LEVEL, _MAX_HELPER_STACK)
    result: list[Any] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            error.append(exc)

    with _stack_size_lock:
        try:
            old = threading.stack_size(stack)
        except (ValueError, RuntimeError):  # this platform cannot size thread stacks
            return fn(*args)
        try:
            thread = threading.Thread(target=run, name="nbcluster-serialize", daemon=True)
            thread.start()
        except RuntimeError:  # cannot start a thread (for example, out of memory for stacks)
            thread = None
        finally:
            threading.stack_size(old)
    if thread is None:
        return fn(*args)
    thread.join()
    if error:
        raise error[0]
    return result[0]


_stack_size_lock = threading.Lock()


def note_contained_ref(obj: object) -> None:
    """Record that ``obj`` (an ``ObjectRef``) is being pickled by the running ``serialize``.

    ``ObjectRef.__reduce__`` calls this. Outside ``serialize`` it does nothing.
    """
    refs = getattr(_tls, "refs", None)
    if refs is not None:
        refs.append(obj)


# --------------------------------------------------------------------------------------------
# deserialize


def deserialize(data: bytes | bytearray | memoryview, context: object = None) -> Any:
    """Rebuild a value from its encoding.

    Out-of-band buffers are passed to ``pickle.loads`` as slices of ``data``: numpy arrays
    share its memory (read-only when ``data`` is read-only, for example a store mapping).
    ``context``, when given, is returned by :func:`current_deserialize_context` while the
    value is being rebuilt.
    """
    if context is None:
        if type(data) is bytes and data.startswith(_PLAIN_HEADER):
            return _loads(data[_PLAIN_OFFSET:])
        return _decode(data)
    previous = getattr(_tls, "context", None)
    _tls.context = context
    try:
        return _decode(data)
    finally:
        _tls.context = previous


def _decode(data: bytes | bytearray | memoryview) -> Any:
    view = _as_bytes_view(data)
    size = view.nbytes
    try:
        magic, version, _flags, _reserved, nbuf = _HEADER.unpack_from(view)
    except struct.error:
        raise ValueError("not an nbcluster-serialized value: too short") from None
    if magic != MAGIC or version != VERSION:
        raise ValueError(
            f"not an nbcluster-serialized value (magic {bytes(magic)!r}, version {version})"
        )
    if nbuf == 0:
        return _loads(view[_PLAIN_OFFSET:])
    if _HEADER.size + _ENTRY.size * (nbuf + 1) > size:
        raise ValueError("corrupt nbcluster-serialized value: table out of bounds")
    table = struct.unpack_from(f"<{2 * (nbuf + 1)}Q", view, _HEADER.size)
    for i in range(0, len(table), 2):
        if table[i] + table[i + 1] > size:
            raise ValueError("corrupt nbcluster-serialized value: a part is out of bounds")
    buffers = [view[table[i] : table[i] + table[i + 1]] for i in range(2, len(table), 2)]
    return _loads(view[table[0] : table[0] + table[1]], buffers=buffers)


def _as_bytes_view(data: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def register_ref_deserializer_hook(
    fn: Callable[[object], None] | None,
) -> Callable[[object], None] | None:
    """Install the function :func:`_ref_deserialized` calls for every rebuilt ``ObjectRef``.

    The core client installs one (it registers the ref as borrowed, for example). Pass
    ``None`` to remove it. Returns the previous hook.
    """
    global _on_ref_deserialized
    previous = _on_ref_deserialized
    _on_ref_deserialized = fn
    return previous


def _ref_deserialized(obj: object) -> None:
    """Called by the function that rebuilds an ``ObjectRef`` during ``deserialize``."""
    hook = _on_ref_deserialized
    if hook is not None:
        hook(obj)


def current_deserialize_context() -> object:
    """The ``context`` given to the running :func:`deserialize` in this thread, or ``None``."""
    return getattr(_tls, "context", None)


def function_hash(payload: bytes) -> bytes:
    """16-byte BLAKE2b digest of a pickled function: its key in the function table."""
    return hashlib.blake2b(payload, digest_size=16).digest()


# --------------------------------------------------------------------------------------------
# error reports


def _serialization_error(value: object, exc: BaseException, what: str, name: str) -> TypeError:
    if _is_recursion_error(exc):
        message = (
            f"Could not serialize {what}: {name} is nested too deeply to pickle "
            f"({type(exc).__name__}: {exc}). Flatten the structure, or build it inside the task."
        )
    else:
        path, culprit, culprit_exc = _find_culprit(value, name, exc)
        hint = _GENERATOR_HINT if isinstance(culprit, types.GeneratorType) else _DEFAULT_HINT
        message = (
            f"Could not serialize {what}: {path} is a {_type_name(culprit)} "
            f"({type(culprit_exc).__name__}: {culprit_exc}). {hint}"
        )
    # The message names the path already; exceptions.SerializationError would repeat it
    # if it were also passed as ``object_path``.
    return SerializationError(message)


def _is_recursion_error(exc: BaseException) -> bool:
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, RecursionError):
            return True
        if isinstance(exc, pickle.PicklingError) and "recursion" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        seen += 1
    return False


def _type_name(obj: object) -> str:
    t = type(obj)
    if t.__module__ == "builtins":
        return t.__qualname__
    return f"{t.__module__}.{t.__qualname__}"


def _pickle_error(obj: object) -> BaseException | None:
    """The exception pickling ``obj`` alone raises, or ``None`` if it pickles."""
    try:
        with io.BytesIO() as file:
            make_pickler(file, _drop).dump(obj)
    except Exception as exc:  # noqa: BLE001 - any failure counts as unpicklable
        return exc
    return None


def _drop(_buffer: pickle.PickleBuffer) -> None:
    """Buffer callback that keeps every buffer out of band (so trial pickles copy nothing)."""
    return None


def _find_culprit(
    value: object, name: str, exc: BaseException
) -> tuple[str, object, BaseException]:
    """Walk down from ``value`` to the innermost part that cannot be pickled.

    Depth-first: the first child that fails to pickle on its own is followed. A part whose
    only failing children lead back to an ancestor (a cycle) is not the culprit: the walk
    backs up and tries the next sibling, and reports such a part only if nothing better is
    found. Bounded in depth and in time (``_MAX_WALK_SECONDS``), and never revisits a part.
    """
    # frame: [path, obj, exc, children iterator, saw a child that is an ancestor]
    stack: list[list[Any]] = [[name, value, exc, _children(value), False]]
    on_path = {id(value)}
    visited = {id(value)}
    fallback: tuple[str, object, BaseException] | None = None
    deadline = time.monotonic() + _MAX_WALK_SECONDS
    while stack:
        frame = stack[-1]
        descended = False
        if len(stack) <= _MAX_WALK_DEPTH:
            for suffix, child in frame[3]:
                if id(child) in on_path:
                    frame[4] = True
                    continue
                if id(child) in visited or type(child) in _PLAIN_TYPES:
                    continue
                visited.add(id(child))
                if time.monotonic() > deadline:
                    break
                child_exc = _pickle_error(child)
                if child_exc is not None and not _is_recursion_error(child_exc):
                    stack.append([frame[0] + suffix, child, child_exc, _children(child), False])
                    on_path.add(id(child))
                    descended = True
                    break
        if descended:
            continue
        path, obj, obj_exc, _, cycles_back = frame
        if not cycles_back:
            return path, obj, obj_exc
        if fallback is None:
            fallback = (path, obj, obj_exc)
        stack.pop()
        on_path.discard(id(obj))
    return fallback if fallback is not None else (name, value, exc)


def _children(obj: object) -> Iterator[tuple[str, object]]:
    """The parts pickling ``obj`` would pickle, each with its path suffix."""
    t = type(obj)
    if isinstance(obj, dict):
        for k, v in list(obj.items()):  # type: ignore[attr-defined]
            yield f"[{k!r}]", v
        for k in list(obj):  # type: ignore[call-overload]
            yield f" (the dict key {k!r})", k
        return
    if isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield f"[{i}]", v
        return
    if isinstance(obj, set | frozenset):
        for i, v in enumerate(list(obj)):
            yield f" (set element {i})", v
        return
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        for var, cell in zip(code.co_freevars, obj.__closure__ or (), strict=False):
            try:
                contents = cell.cell_contents
            except ValueError:  # empty cell
                continue
            yield f" (closure variable {var!r})", contents
        globs = obj.__globals__
        for gname in _global_names(code):
            if gname in globs:
                yield f" (global {gname!r})", globs[gname]
        for i, default in enumerate(obj.__defaults__ or ()):
            yield f" (default argument {i})", default
        for key, default in (obj.__kwdefaults__ or {}).items():
            yield f" (default of {key!r})", default
        return
    if isinstance(obj, types.MethodType):
        yield ".__self__", obj.__self__
        yield ".__func__", obj.__func__
        return
    import functools

    if isinstance(obj, functools.partial):
        yield ".func", obj.func
        for i, arg in enumerate(obj.args):
            yield f".args[{i}]", arg
        for key, arg in obj.keywords.items():
            yield f".keywords[{key!r}]", arg
        return
    if "__reduce__" in t.__dict__:
        return  # its own reducer decides what is pickled (it may refuse: ObjectRefGenerator)
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        for key, v in list(attrs.items()):
            yield f".{key}", v
    for klass in t.__mro__:
        for slot in klass.__dict__.get("__slots__", ()):
            if isinstance(slot, str) and slot not in ("__dict__", "__weakref__"):
                sentinel = object()
                v = getattr(obj, slot, sentinel)
                if v is not sentinel:
                    yield f".{slot}", v


def _global_names(code: types.CodeType) -> list[str]:
    """Global names used by ``code`` and the code objects nested in it (bounded)."""
    names: list[str] = []
    stack = [code]
    seen = 0
    while stack and seen < 100:
        c = stack.pop()
        seen += 1
        names.extend(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return list(dict.fromkeys(names))
