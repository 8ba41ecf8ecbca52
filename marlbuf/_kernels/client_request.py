"""Valgrind client requests from compiled code: the amd64 magic sequence as inline assembly.

Valgrind recognises a client request by an instruction sequence that does nothing on a real CPU
(``valgrind.h``, amd64): ``rol rdi`` by 3, 13, 61 and 51 bits (a full 128-bit turn), then
``xchg rbx, rbx``; ``rax`` holds the address of the request block, the answer comes back in
``rdx``, which keeps the caller's default when no valgrind is there. Only valid on x86-64: the
caller (:mod:`marlbuf.profiling.callgrind`) never calls it elsewhere.
"""

from __future__ import annotations

from typing import Any

import llvmlite.binding as llvm_binding
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

# Numba does not initialise LLVM's assembly parser; inline asm needs it (cheap, idempotent).
llvm_binding.initialize_native_asmparser()


@intrinsic
def _magic_sequence(typingctx: Any, block_address: Any, default: Any) -> Any:
    """The amd64 client-request sequence as inline asm: rax = request block, rdx = result."""
    signature = types.uint64(types.uint64, types.uint64)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        word = ir.IntType(64)
        asm_type = ir.FunctionType(word, [word, word])
        # AT&T syntax; "$$" is a literal "$" in LLVM inline asm. rdi turns 128 bits in all, so
        # it is unchanged; only valgrind gives the sequence a meaning.
        code = (
            "rolq $$3, %rdi ; rolq $$13, %rdi\n\t"
            "rolq $$61, %rdi ; rolq $$51, %rdi\n\t"
            "xchgq %rbx, %rbx"
        )
        constraints = "={dx},{ax},0,~{cc},~{memory},~{dirflag},~{fpsr},~{flags}"
        return builder.asm(asm_type, code, constraints, list(args), side_effect=True)

    return signature, codegen


@njit(cache=True, nogil=True)
def client_request_kernel(block_address: np.uint64, default: np.uint64) -> np.uint64:
    """Issue one client request.

    Parameters
    ----------
    block_address : uint64
        Address of a C-contiguous uint64 array of shape (6,): request code, then 5 arguments.
    default : uint64
        Returned when not running under valgrind.
    """
    # called with the typing context filled in by Numba; mypy sees the raw signature
    return _magic_sequence(block_address, default)  # type: ignore[call-arg]
