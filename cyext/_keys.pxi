# The forms a batch's keys may take, in one copy: text included by _common.pxi (so by
# every sketch kernel) and by _hashing.pyx (hash64_many). The time arguments are read
# in _common.pxi; the values of one family (the score kernels' deltas and limits,
# count-min's counts) by that family's kernel. docs/hashing.md, "Batch arguments".
from libc.stdint cimport uint64_t

from ghash cimport Hasher
from gkeys cimport hash_items, hash_rows

cdef enum:
    KEYS_HASHED = 0     # a 1-D uint64 array of key hashes, used as they are
    KEYS_LIST = 1       # a list/tuple of bytes / str / bytearray keys
    KEYS_ROWS = 2       # a 2-D C-contiguous uint8 array, one fixed-width key per row


cdef tuple _key_form(object keys):
    """``(kind, source)`` of a batch's keys:

    - a list or tuple: ``KEYS_LIST``, the keys (bytes, str as UTF-8, bytearray);
    - a numpy array, or any object with the buffer or array protocol
      (``array.array``, ``memoryview``, a pandas column's ``.to_numpy()``):
      1-D unsigned 64-bit: ``KEYS_HASHED``, a C-contiguous uint64 array;
      2-D uint8: ``KEYS_ROWS``, a C-contiguous copy or view of its rows;
      1-D object: ``KEYS_LIST``, its elements;
      signed integers are refused (ids are not hashes: ``np.arange(n)`` would index
      every row of a sketch alike; hashes held as int64 pass with ``.view(np.uint64)``);
      numpy ``S``/``U`` strings are refused (numpy drops their trailing NUL bytes);
    - a single bytes / str / bytearray key: refused;
    - any other iterable: ``KEYS_LIST``, its elements."""
    if isinstance(keys, (list, tuple)):
        return KEYS_LIST, keys
    if isinstance(keys, (bytes, str, bytearray)):
        raise TypeError("a batch takes a sequence of keys or a uint64 array of key hashes, "
                        "not a single key")
    if not isinstance(keys, np.ndarray):
        if hasattr(keys, "__array__") or _has_buffer(keys):
            keys = np.asarray(keys)
        else:
            return KEYS_LIST, list(keys)
    cdef object arr = keys
    cdef str kind = arr.dtype.kind
    if arr.ndim == 1 and kind == "u" and arr.dtype.itemsize == 8:
        return KEYS_HASHED, np.ascontiguousarray(arr, dtype=np.uint64)
    if arr.ndim == 2 and kind == "u" and arr.dtype.itemsize == 1:
        return KEYS_ROWS, np.ascontiguousarray(arr)
    if arr.ndim == 1 and kind == "O":
        return KEYS_LIST, arr.tolist()
    if kind == "i":
        raise TypeError(f"key arrays of signed integers ({arr.dtype}) are refused: pre-hashed "
                        "keys are uint64 (hashes held as int64: pass .view(np.uint64); ids: "
                        "hash them, or pass them as bytes)")
    if kind in "SU":
        raise TypeError(f"numpy {arr.dtype} key arrays are refused (numpy drops trailing NUL "
                        "bytes); pass a list or an object array of bytes/str")
    raise TypeError(f"a key array must hold uint64 hashes (1-D) or fixed-width keys as uint8 "
                    f"rows (2-D), not {arr.dtype} with {arr.ndim} dimension(s)")


cdef inline bint _has_buffer(object x):
    try:
        memoryview(x)
    except TypeError:
        return False
    return True


cdef inline Py_ssize_t _form_size(int kind, object source):
    """How many keys a ``_key_form`` source holds."""
    return source.shape[0] if kind == KEYS_ROWS else len(source)


cdef int _hash_form(const Hasher* h, int kind, object source, uint64_t* out, Py_ssize_t n) except -1:
    """Hash the ``n`` keys of a ``KEYS_LIST`` or ``KEYS_ROWS`` source into ``out`` with
    ``h`` (its algorithm, seed and secret key): ``gkeys.hash_items`` or ``hash_rows``."""
    if n:
        if kind == KEYS_ROWS:
            hash_rows(h, source, out)
        else:
            hash_items(h, source, out, n)
    return 0
