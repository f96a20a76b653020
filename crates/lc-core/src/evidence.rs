//! Signed provider evidence: DSSE envelopes over canonical JSON statements.
