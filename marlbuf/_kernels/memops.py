"""Word-copy primitives of the gather kernels: whole cache lines moved as vectors, stores that
bypass the cache for outputs larger than it, and software prefetches of rows ahead.

Numba has no way to say "copy these 64 bytes as one vector" or "this store need not read its
line first", and LLVM cannot prove that a gather's table and output do not overlap, so a plain
copy loop gets a run-time overlap check, a vector body and scalar remainders per call. These
LLVM intrinsics (``numba.extending.intrinsic``) state it directly:

* :func:`copy_line` loads 8 words as one ``<8 x i64>`` vector (unaligned) and stores it;
* :func:`stream_line` is the same with a *non-temporal* store (``!nontemporal``: ``movntdq`` on
  x86, ``stnp`` on Arm): the line is written to memory without being read into the cache first
  (no read-for-ownership) and without evicting what is there. Its destination must be a whole
  64-byte-aligned line (:func:`stream_words` only hands it such lines);
* :func:`prefetch` asks for the line holding one word (``llvm.prefetch``: a hint, never a
  fault, dropped on targets without one);
* :func:`store_fence` orders the streaming stores before everything that follows (a sequentially
  consistent fence: ``mfence`` on x86), so another thread that sees the kernel return sees the
  whole output;
* :func:`word_address` is the address of an array's first word (for alignment);
* :func:`widen_halves` converts 16 float16 bit patterns to float32 bit patterns as one vector
  (``vcvtph2ps`` where the CPU has F16C, else the conversion's integer arithmetic on vectors),
  exactly as NumPy's ``astype(np.float32)`` does, NaN payloads included; Numba has no float16,
  and a table lookup per element (the exact scalar alternative) is a gather that does not
  vectorise.

The helpers below (``inline="always"``) build spans from them; every offset and length is an
unsigned number of 8-byte words (no negative-index wraparound test). None checks bounds: the
kernels that use them copy spans their callers validated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import llvmlite.binding as llvm_binding
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils, config
from numba.extending import intrinsic

#: words per cache line (64 bytes)
LINE_WORDS = 8
#: float16 values per :func:`widen_halves` (their float32 results fill one cache line)
HALF_LANES = 16
_LINE = np.uint64(LINE_WORDS)
_ZERO = np.uint64(0)
_ONE = np.uint64(1)


def _intrinsic(typer: Callable[..., Any]) -> Any:
    """``numba.extending.intrinsic``, typed ``Any`` for the type checker (a compiled intrinsic
    is called without the typing context its typer receives)."""
    return intrinsic(typer)


def _word_array(arr: Any) -> bool:
    """Whether ``arr`` (a Numba type) is a C-contiguous array of 8-byte unsigned words."""
    return isinstance(arr, types.Array) and arr.dtype == types.uint64 and arr.layout == "C"


def _word_pointer(context: Any, builder: Any, array_type: Any, array: Any, word: Any) -> Any:
    """LLVM pointer to word ``word`` of ``array`` (as ``i64*``)."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.gep(builder.bitcast(data, ir.IntType(64).as_pointer()), [word])


def _store(builder: Any, value: Any, pointer: Any, align: int, nontemporal: bool) -> None:
    """Store ``value`` at ``pointer`` (a vector pointer); a non-temporal store when asked."""
    store = builder.store(value, pointer, align=align)
    if nontemporal:
        store.set_metadata(
            "nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        )


def _line_codegen(nontemporal: bool) -> Any:
    line = ir.VectorType(ir.IntType(64), LINE_WORDS)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        dst, dst_word, src, src_word = args
        source = _word_pointer(context, builder, sig.args[2], src, src_word)
        target = _word_pointer(context, builder, sig.args[0], dst, dst_word)
        value = builder.load(builder.bitcast(source, line.as_pointer()), align=8)
        target = builder.bitcast(target, line.as_pointer())
        _store(builder, value, target, 64 if nontemporal else 8, nontemporal)
        return context.get_dummy_value()

    return codegen


@_intrinsic
def copy_line(typingctx: Any, dst: Any, dst_word: Any, src: Any, src_word: Any) -> Any:
    """``dst[dst_word : dst_word + 8] = src[src_word : src_word + 8]`` as one vector load and
    store (both unaligned); ``dst``, ``src``: C-contiguous uint64 arrays, words: uint64."""
    if not (_word_array(dst) and _word_array(src)):
        return None
    return types.void(dst, types.uint64, src, types.uint64), _line_codegen(False)


@_intrinsic
def stream_line(typingctx: Any, dst: Any, dst_word: Any, src: Any, src_word: Any) -> Any:
    """:func:`copy_line` with a non-temporal store; the destination line must start on a
    64-byte boundary. Issue :func:`store_fence` before the output is handed over."""
    if not (_word_array(dst) and _word_array(src)):
        return None
    return types.void(dst, types.uint64, src, types.uint64), _line_codegen(True)


@_intrinsic
def prefetch(typingctx: Any, arr: Any, word: Any) -> Any:
    """Prefetch the cache line holding ``arr[word]`` for reading (a hint: never faults)."""
    if not _word_array(arr):
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        byte = ir.IntType(8).as_pointer()
        address = builder.bitcast(_word_pointer(context, builder, sig.args[0], *args), byte)
        int32 = ir.IntType(32)
        hint = builder.module.declare_intrinsic(
            "llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [byte, int32, int32, int32])
        )
        # read, highest temporal locality (keep in every cache level), data cache
        builder.call(hint, [address, int32(0), int32(3), int32(1)])
        return context.get_dummy_value()

    return types.void(arr, types.uint64), codegen


@_intrinsic
def store_fence(typingctx: Any) -> Any:
    """Order every earlier store (streaming ones included) before every later access."""

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


@_intrinsic
def word_address(typingctx: Any, arr: Any) -> Any:
    """The address of ``arr``'s first element, as a uint64."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        return builder.ptrtoint(data, ir.IntType(64))

    return types.uint64(arr), codegen


@njit(inline="always")
def copy_words(dst: np.ndarray, dst0: Any, src: np.ndarray, src0: Any, count: Any) -> None:
    """``dst[dst0 : dst0 + count] = src[src0 : src0 + count]``: whole lines as vectors, the last
    line overlapping the one before it (spans of 8 words or more), else word by word."""
    if count >= _LINE:
        last = count - _LINE
        k = _ZERO
        while k < last:
            copy_line(dst, dst0 + k, src, src0 + k)
            k += _LINE
        copy_line(dst, dst0 + last, src, src0 + last)
    else:
        k = _ZERO
        while k < count:
            dst[dst0 + k] = src[src0 + k]
            k += _ONE


@njit(inline="always")
def _copy_short(dst: np.ndarray, dst0: Any, src: np.ndarray, src0: Any, count: Any) -> None:
    """Word by word (spans shorter than a line)."""
    k = _ZERO
    while k < count:
        dst[dst0 + k] = src[src0 + k]
        k += _ONE


@njit(inline="always")
def stream_words(dst: np.ndarray, dst0: Any, src: np.ndarray, src0: Any, count: Any) -> None:
    """:func:`copy_words` with non-temporal stores for every destination line the span covers
    whole; the partial lines at its ends are written word by word (never by a vector that would
    also write into a streamed line: a line written both ways is flushed twice)."""
    lead = (_LINE - (word_address(dst) // _LINE + dst0) % _LINE) % _LINE  # to the first line
    if count < lead + _LINE:
        copy_words(dst, dst0, src, src0, count)
        return
    _copy_short(dst, dst0, src, src0, lead)
    k = lead
    while k + _LINE <= count:
        stream_line(dst, dst0 + k, src, src0 + k)
        k += _LINE
    _copy_short(dst, dst0 + k, src, src0 + k, count - k)


@njit(inline="always")
def move_words(
    dst: np.ndarray, dst0: Any, src: np.ndarray, src0: Any, count: Any, streaming: bool
) -> None:
    """:func:`stream_words` when ``streaming``, else :func:`copy_words`."""
    if streaming:
        stream_words(dst, dst0, src, src0, count)
    else:
        copy_words(dst, dst0, src, src0, count)


@njit(inline="always")
def zero_words(dst: np.ndarray, lo: Any, hi: Any) -> None:
    """``dst[lo:hi] = 0`` (short runs of padding: a loop, not a call)."""
    k = lo
    while k < hi:
        dst[k] = _ZERO
        k += _ONE


@njit(inline="always")
def prefetch_words(arr: np.ndarray, word: Any, count: Any, max_lines: Any) -> None:
    """Prefetch the lines of ``arr[word : word + count]``, at most ``max_lines`` of them (the
    hardware's own prefetcher follows a long sequential span once it has started)."""
    end = min(count, max_lines * _LINE)
    k = _ZERO
    while k < end:
        prefetch(arr, word + k)
        k += _LINE
    if end == count and count > _ZERO:
        prefetch(arr, word + count - _ONE)  # the line of the last word, if the span ends in one


def _has_f16c() -> bool:
    """Whether the code Numba compiles may use F16C (x86 only): the features it compiles for
    (``NUMBA_CPU_FEATURES`` if set, else the host's) include ``+f16c``."""
    features = getattr(config, "CPU_FEATURES", None)
    if features is None:
        features = llvm_binding.get_host_cpu_features().flatten()
    return "+f16c" in features.split(",")


def _typed_array(arr: Any, dtype: Any) -> bool:
    return isinstance(arr, types.Array) and arr.dtype == dtype and arr.layout == "C"


def _widen_codegen(nontemporal: bool) -> Any:
    lanes = HALF_LANES
    int16, int32 = ir.IntType(16), ir.IntType(32)
    halves_type = ir.VectorType(int16, lanes)
    bits_type = ir.VectorType(int32, lanes)
    floats_type = ir.VectorType(ir.FloatType(), lanes)

    def splat(value: int, kind: Any = bits_type) -> ir.Constant:
        return ir.Constant(kind, [value] * lanes)

    def exact(builder: Any, halves: Any) -> Any:
        """The conversion in integer arithmetic (and one exact float multiply): every lane."""
        wide = builder.zext(halves, bits_type)
        sign = builder.shl(builder.and_(wide, splat(0x8000)), splat(16))
        exponent = builder.and_(wide, splat(0x7C00))
        mantissa = builder.and_(wide, splat(0x03FF))
        # normal numbers: rebias the exponent (15 -> 127) under the shifted bits
        normal = builder.add(
            builder.shl(builder.and_(wide, splat(0x7FFF)), splat(13)), splat(0x38000000)
        )
        # subnormals and zeros: mantissa * 2**-24, exact in float32
        tiny = builder.fmul(
            builder.uitofp(mantissa, floats_type), ir.Constant(floats_type, [2.0**-24] * lanes)
        )
        finite = builder.select(
            builder.icmp_unsigned("==", exponent, splat(0)),
            builder.bitcast(tiny, bits_type),
            normal,
        )
        # inf and NaN: exponent all ones, the payload shifted as NumPy does, never quieted
        special = builder.or_(splat(0x7F800000), builder.shl(mantissa, splat(13)))
        is_special = builder.icmp_unsigned("==", exponent, splat(0x7C00))
        return builder.or_(builder.select(is_special, special, finite), sign)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        dst, dst_unit, src, src_unit = args
        out = context.make_array(sig.args[0])(context, builder, dst).data
        source = context.make_array(sig.args[2])(context, builder, src).data
        halves = builder.load(
            builder.bitcast(builder.gep(source, [src_unit]), halves_type.as_pointer()), align=2
        )
        if _has_f16c():
            # vcvtph2ps is exact but for NaNs (it quiets signalling ones): lanes whose exponent
            # is all ones (never in staged data: staging refuses inf and NaN) take the exact
            # path, behind a branch, so the common case is one conversion per 16 values
            result = cgutils.alloca_once(builder, bits_type)
            builder.store(
                builder.bitcast(
                    builder.fpext(
                        builder.bitcast(halves, ir.VectorType(ir.HalfType(), lanes)), floats_type
                    ),
                    bits_type,
                ),
                result,
            )
            all_ones = splat(0x7C00, halves_type)
            special = builder.icmp_unsigned("==", builder.and_(halves, all_ones), all_ones)
            any_special = builder.icmp_unsigned(
                "!=", builder.bitcast(special, ir.IntType(lanes)), ir.Constant(ir.IntType(lanes), 0)
            )
            with builder.if_then(any_special, likely=False):
                builder.store(exact(builder, halves), result)
            value = builder.load(result)
        else:
            value = exact(builder, halves)
        target = builder.bitcast(builder.gep(out, [dst_unit]), bits_type.as_pointer())
        _store(builder, value, target, 64 if nontemporal else 4, nontemporal)
        return context.get_dummy_value()

    return codegen


@_intrinsic
def widen_halves(typingctx: Any, dst: Any, dst_unit: Any, src: Any, src_unit: Any) -> Any:
    """``dst[dst_unit : dst_unit + 16]`` = the float32 bit patterns of the float16 bit patterns
    ``src[src_unit : src_unit + 16]``; ``dst``: C-contiguous uint32, ``src``: uint16."""
    if not (_typed_array(dst, types.uint32) and _typed_array(src, types.uint16)):
        return None
    return types.void(dst, types.uint64, src, types.uint64), _widen_codegen(False)


@_intrinsic
def stream_halves(typingctx: Any, dst: Any, dst_unit: Any, src: Any, src_unit: Any) -> Any:
    """:func:`widen_halves` with a non-temporal store; ``dst[dst_unit]`` must start a 64-byte
    line. Issue :func:`store_fence` before the output is handed over."""
    if not (_typed_array(dst, types.uint32) and _typed_array(src, types.uint16)):
        return None
    return types.void(dst, types.uint64, src, types.uint64), _widen_codegen(True)


_LANES = np.uint64(HALF_LANES)


@njit(inline="always")
def _widen_short(
    dst: np.ndarray, dst0: Any, src: np.ndarray, src0: Any, count: Any, lut: np.ndarray
) -> None:
    """Element by element through the 65,536-entry table (spans shorter than a vector)."""
    k = _ZERO
    while k < count:
        dst[dst0 + k] = lut[src[src0 + k]]
        k += _ONE


@njit(inline="always")
def widen_span(
    dst: np.ndarray,
    dst0: Any,
    src: np.ndarray,
    src0: Any,
    count: Any,
    lut: np.ndarray,
    streaming: bool,
) -> None:
    """``dst[dst0 : dst0 + count]`` = float32 bits of the float16 bits ``src[src0 : src0 +
    count]`` (uint32 / uint16 arrays): 16 at a time as vectors (the last vector overlapping
    the one before it), shorter spans through ``lut`` (:data:`marlbuf._kernels.plan.
    HALF_TO_FLOAT_BITS`). With ``streaming``, the destination lines the span covers whole are
    written with non-temporal stores, the partial ones at its ends through the table."""
    if count < _LANES:
        _widen_short(dst, dst0, src, src0, count, lut)
        return
    if streaming:
        # uint32 units to the first 64-byte line of the destination
        lead = (_LANES - (word_address(dst) // np.uint64(4) + dst0) % _LANES) % _LANES
        if count >= lead + _LANES:
            _widen_short(dst, dst0, src, src0, lead, lut)
            k = lead
            while k + _LANES <= count:
                stream_halves(dst, dst0 + k, src, src0 + k)
                k += _LANES
            _widen_short(dst, dst0 + k, src, src0 + k, count - k, lut)
            return
    last = count - _LANES
    k = _ZERO
    while k < last:
        widen_halves(dst, dst0 + k, src, src0 + k)
        k += _LANES
    widen_halves(dst, dst0 + last, src, src0 + last)
