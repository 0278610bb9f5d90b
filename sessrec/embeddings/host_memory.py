"""Host-memory advice for the embedding core: huge pages for big tables, and keeping freed memory.

Both are Linux/glibc requests made through ``ctypes``; each returns whether it was granted, and
everything works (more slowly) when it was not.
"""

from __future__ import annotations

import ctypes
import sys

import torch

_HUGE_PAGE = 2 * 2**20
_MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux
_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3


def advise_huge_pages(t: torch.Tensor) -> bool:
    """Ask Linux to back the untouched CPU allocation of ``t`` with 2 MB transparent huge pages.

    A lookup or an update touches rows scattered over the whole table, so with 4 KB pages nearly every
    row costs a TLB miss; 2 MB pages cover a 0.7 GB table with 340 TLB entries instead of 170,000.
    Call it before the first write (the pages are chosen when first touched). Only the 2 MB-aligned
    interior is advised. Returns whether the advice was given (False off Linux, on other devices,
    for allocations under 4 MB, or when ``madvise`` fails); the tensor is usable either way.
    """
    size = t.numel() * t.element_size()
    if sys.platform != "linux" or t.device.type != "cpu" or size < 2 * _HUGE_PAGE:
        return False
    first = -(-t.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE
    last = (t.data_ptr() + size) // _HUGE_PAGE * _HUGE_PAGE
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc.madvise(first, last - first, _MADV_HUGEPAGE) == 0
    except (OSError, AttributeError):
        return False


def retain_freed_memory(trim_bytes: int = 2**30, mmap_bytes: int = 32 * 2**20) -> bool:
    """Ask glibc's malloc to keep freed memory for reuse instead of handing it back to the kernel.

    A training step allocates and frees the same tens of MB every step (pooled outputs, gradients).
    By default glibc returns free memory at the top of its heap to the kernel once it exceeds a
    threshold (twice the largest freed block, a few MB), and serves blocks above the mmap threshold
    with fresh mappings; either way the next step touches new pages and pays a page fault per 4 KB
    (the cost is in ``docs/benchmarks.md``, Embedding core, ``--malloc default``). This sets
    the trim threshold to ``trim_bytes`` and the mmap threshold to ``mmap_bytes`` (glibc's maximum,
    32 MB), so blocks up to 32 MB are recycled from the heap. The cost: the process keeps up to
    ``trim_bytes`` of freed memory. Process-wide; every allocation of the process is affected, so
    sessrec calls it only when asked (`DLRMTask` with ``retain_freed_memory: true``).

    Returns whether glibc accepted both settings (False on other platforms or C libraries).
    """
    if sys.platform != "linux":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, int(mmap_bytes)) == 1 and mallopt(_M_TRIM_THRESHOLD, int(trim_bytes)) == 1
