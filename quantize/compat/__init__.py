"""Every use of another library's private or internal names, one module per library, each guarded by the versions
it was checked on. A guard that no longer holds is a loud failure in tests/compat/ (and a warning at run time with
the library's own code path kept), never a silent change of what is computed."""
