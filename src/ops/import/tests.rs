//! Unit tests of the import copy.
