"""The Windows API binding both guards call: ctypes prototypes (win32calls), the loader and the generic
wrappers (win32), the one error type and the file-effect seam (api), the per-user state layout (state).

Imports on Linux (ctypes' Windows parts load on the first call), so every guard's Windows module is
type-checked and unit-tested here against the fakes in tests/support. docs/windows.md says what has run where.
"""
