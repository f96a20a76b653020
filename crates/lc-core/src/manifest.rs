//! Runtime manifests: the canonical description whose SHA-256 is a runtime's digest.
