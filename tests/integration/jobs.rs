//! Whole jobs that go right: formats, encodings, bodies, exit codes, status and export.
