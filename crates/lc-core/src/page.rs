//! Output pages: the numbered chunks of an exec attempt's stdout, stderr and exit status.
