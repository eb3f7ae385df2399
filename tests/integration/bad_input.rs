//! Bad input of every kind: a clear message naming the file, line or flag, a non-zero exit.
