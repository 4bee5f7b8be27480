"""The hostile values, by argument class (what a case puts in one argument's place), the numbers
they are made of, and the c10 enum values (ScalarType, Layout, MemoryFormat) enums travel as."""

import math

import torch


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
NAN, INF = math.nan, math.inf

HOSTILE = {
    "int": [-1, 0, 7, 2**31, 2**40, 2**62, INT64_MIN, INT64_MAX, -(2**40)],
    "ints": [[2**40], [-5], [INT64_MIN], [], [1 << 20, 1 << 20], [10000, 10000]],
    "float": [NAN, INF, -INF, 1e30, -1e30],
    "floats": [[NAN], [INF, INF], [1e30, 1e30], [], [-1e30]],
    "number": [NAN, INF, -INF, 1e30, -1e30, INT64_MIN, INT64_MAX, -1, 0],
    "bool": ["flip"],
    "bools": [[], [True] * 5],
    "str": ["bogus"],
    # enums travel as ints: just outside the range, and inside it the odd ones
    "dtype": [-1, 8, 9, 10, 12, 13, 14, 16, 24, 44, 2**31, INT64_MIN],  # complex, quantized, bits, past the end
    "layout": [1, 2, 3, 4, 5, 6, 7, 8, -1, 2**40],  # sparse, mkldnn, jagged, past the end
    "memfmt": [1, 2, 3, 4, -1, 2**40],
    "tensor": ["empty", "0d", "nan", "inf", "mismatch", "2**33", "-2**40", "INT64_MIN", "INT64_MAX", "-1",
               "past_end"],
}
ENUM_KINDS = ("dtype", "layout", "memfmt")
ENUM_RANGE = {"dtype": 16, "layout": 7, "memfmt": 4}  # values torch's Python binding takes safely

# c10 enum values of the Python objects torch uses for defaults
DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32, torch.float64,
          torch.complex32, torch.complex64, torch.complex128, torch.bool, torch.qint8, torch.quint8, torch.qint32,
          torch.bfloat16]
LAYOUTS = {torch.strided: 0, torch.sparse_coo: 1, torch.sparse_csr: 2, torch._mkldnn: 3, torch.sparse_csc: 4,
           torch.sparse_bsr: 5, torch.sparse_bsc: 6}
MEMFMTS = {torch.contiguous_format: 0, torch.preserve_format: 1, torch.channels_last: 2, torch.channels_last_3d: 3}
