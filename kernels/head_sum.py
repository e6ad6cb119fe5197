"""The sum over a key head's value heads (GQA) inside the kernels whose
programs each take one value head: the program that comes last sums them.

Each program stores its partial (rounded to ``scratch``'s dtype) at its value
head's rows of ``scratch`` and takes a ticket from its key head's counter
(``counts``, zeros before the launch); the one whose ticket is the last
(``RATIO - 1``) reads the others' partials and adds them in the order of the
heads, its own rounded like theirs, so the sum has the same bits whichever
program comes last. No program waits for another. Under Triton's interpreter
the programs run one after the other: the last value head's program sums.
"""
import triton
import triton.language as tl


@triton.jit
def arrive(counts, i_count):
    """This program's ticket (0 to ``RATIO - 1``) at counter ``i_count``, taken
    once its partials are stored: the barrier orders every thread's stores
    before the atomic, whose release (GPU scope) makes them visible to the
    program that comes last, and whose acquire lets the last one read the
    others' stores."""
    tl.debug_barrier()
    return tl.atomic_add(counts + i_count, 1, sem="acq_rel", scope="gpu")


@triton.jit
def masked_if(mask, cond):
    """``mask`` where the scalar ``cond`` holds, else all false (``mask & cond``
    gives an int32 mask under Triton 3.9's interpreter, which loads refuse)."""
    return tl.where(cond, mask, False)


@triton.jit
def head_sum(b_own, scratch, rows0, mask, i_r, last, RATIO: tl.constexpr, HEAD_STRIDE: tl.constexpr):
    """The float32 sum over the ``RATIO`` value heads of ``b_own`` (this
    program's partial, head ``i_r``) and the others' in ``scratch`` (head
    ``r`` at offsets ``rows0 + r * HEAD_STRIDE``), each rounded to
    ``scratch``'s dtype, in head order; whole where ``last`` (the others
    are not read elsewhere). Loads bypass L1 (``.cg``): the others' stores
    came from other SMs."""
    b_mine = b_own.to(scratch.dtype.element_ty).to(tl.float32)
    b_sum = tl.zeros_like(b_mine)
    for r in tl.static_range(RATIO):
        b_r = tl.load(scratch + rows0 + r * HEAD_STRIDE, mask=masked_if(masked_if(mask, last), i_r != r),
                      other=0, cache_modifier=".cg")
        b_sum += tl.where(r == i_r, b_mine, b_r.to(tl.float32))
    return b_sum
