//! Unit tests of the queue-type seam.
