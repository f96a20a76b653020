//! Evidence: statements a provider signs about its instances, in DSSE
//! envelopes.
//!
//! A [`Statement`] is serialized as canonical JSON (JCS, RFC 8785), base64
//! encoded into the envelope's `payload`; the signature is Ed25519 over the
//! DSSE pre-authentication encoding [`pae`]`(payloadType, payload bytes)`;
//! `keyid` is the lowercase hex SHA-256 of the 32-byte public key.
//!
//! ```json
//! { "payloadType": "application/vnd.little-compute.evidence+json",
//!   "payload": "<base64 of JCS JSON>",
//!   "signatures": [ { "keyid": "<hex>", "sig": "<base64>" } ] }
//! ```
//!
//! [`verify`] is the only way a caller gets a statement out of an envelope:
//! it checks the payload type, the key id, the signature, that the payload is
//! exactly the canonical form of the statement it decodes to (no second
//! encoding of one statement verifies), and that the statement is about the
//! expected provider, lease and generation.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::page::sha256;

/// The payload type of every evidence envelope.
pub const PAYLOAD_TYPE: &str = "application/vnd.little-compute.evidence+json";

/// The largest envelope payload [`verify`] decodes, in base64 characters:
/// evidence statements are a few hundred bytes.
pub const PAYLOAD_B64_MAX: usize = 4096;

/// What an instance looked like when the provider observed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    /// The command is running.
    Running,
    /// The command exited; the instance's pages may still be unread.
    Exited,
    /// No instance of that lease generation exists on the provider.
    Absent,
}

/// A signed statement; the JSON object has a `statement` tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "statement", rename_all = "snake_case")]
pub enum Statement {
    /// No instance of lease `lease_id` generation `generation` exists on
    /// provider `provider_id`.
    Absence {
        /// The provider that signed.
        provider_id: String,
        /// The sandbox lease.
        lease_id: i64,
        /// The lease generation.
        generation: i64,
    },
    /// Provider `provider_id` refuses every generation `<= generation` of
    /// lease `lease_id` from now on (and holds no instance of them).
    Fence {
        /// The provider that signed.
        provider_id: String,
        /// The sandbox lease.
        lease_id: i64,
        /// The highest fenced generation.
        generation: i64,
    },
    /// What provider `provider_id` observed of lease `lease_id` generation
    /// `generation`.
    Observation {
        /// The provider that signed.
        provider_id: String,
        /// The sandbox lease.
        lease_id: i64,
        /// The lease generation.
        generation: i64,
        /// The observed state.
        state: InstanceState,
    },
    /// Provider `provider_id` never gave the command of lease `lease_id`
    /// generation `generation` to a supervisor, and refuses that generation
    /// (and every earlier one) from now on, so no supervisor of it ever will
    /// be given it: the command never ran and has no output. Only this
    /// exact generation is covered.
    NotSent {
        /// The provider that signed.
        provider_id: String,
        /// The sandbox lease.
        lease_id: i64,
        /// The lease generation.
        generation: i64,
    },
    /// Provider `provider_id` stopped every process of lease `lease_id`
    /// generation `generation` and walked workspace `workspace_id` into
    /// the snapshot whose manifest's SHA-256 is `head`: that tree is the
    /// generation's final workspace state.
    Quiescence {
        /// The provider that signed.
        provider_id: String,
        /// The sandbox lease.
        lease_id: i64,
        /// The lease generation.
        generation: i64,
        /// The workspace.
        workspace_id: i64,
        /// The snapshot's digest, 64 lower-case hex digits.
        head: String,
    },
    /// Provider `provider_id` started lease `lease_id` generation
    /// `generation` on workspace `workspace_id` restored from the snapshot
    /// `head` (every blob verified), mounted writable when `writable`.
    Attachment {
        /// The provider that signed.
        provider_id: String,
        /// The sandbox lease.
        lease_id: i64,
        /// The lease generation.
        generation: i64,
        /// The workspace.
        workspace_id: i64,
        /// The restored snapshot's digest, 64 lower-case hex digits.
        head: String,
        /// Whether the workspace is writable.
        writable: bool,
    },
    /// What provider `provider_id` measured of lease `lease_id` generation
    /// `generation` from the instance's own accounting, when it signed:
    /// `cost` from its cgroup (omitted when that accounting was not
    /// readable: the instance is destroyed, or was started without it),
    /// `externality` from its sandbox (all `false` for a shape without
    /// network, every flag omitted otherwise). An omitted value is
    /// unknown, never zero or `false`.
    Measurement {
        /// The provider that signed.
        provider_id: String,
        /// The sandbox lease.
        lease_id: i64,
        /// The lease generation.
        generation: i64,
        /// The cost so far, when measured.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost: Option<crate::observation::CostObservation>,
        /// The side effects observed so far.
        externality: crate::observation::ExternalityObservation,
    },
}

impl Statement {
    /// The statement's kind: `absence`, `fence`, `observation`,
    /// `not_sent`, `quiescence`, `attachment` or `measurement`.
    pub fn kind(&self) -> &'static str {
        match self {
            Statement::Absence { .. } => "absence",
            Statement::Fence { .. } => "fence",
            Statement::Observation { .. } => "observation",
            Statement::NotSent { .. } => "not_sent",
            Statement::Quiescence { .. } => "quiescence",
            Statement::Attachment { .. } => "attachment",
            Statement::Measurement { .. } => "measurement",
        }
    }

    /// `(provider_id, lease_id, generation)` of the statement.
    pub fn subject(&self) -> (&str, i64, i64) {
        match self {
            Statement::Absence {
                provider_id,
                lease_id,
                generation,
            }
            | Statement::Fence {
                provider_id,
                lease_id,
                generation,
            }
            | Statement::Observation {
                provider_id,
                lease_id,
                generation,
                ..
            }
            | Statement::NotSent {
                provider_id,
                lease_id,
                generation,
            }
            | Statement::Quiescence {
                provider_id,
                lease_id,
                generation,
                ..
            }
            | Statement::Attachment {
                provider_id,
                lease_id,
                generation,
                ..
            }
            | Statement::Measurement {
                provider_id,
                lease_id,
                generation,
                ..
            } => (provider_id, *lease_id, *generation),
        }
    }

    /// What a measurement statement observed (`None` for every other
    /// kind).
    pub fn measured(&self) -> Option<crate::observation::AttemptObservation> {
        match self {
            Statement::Measurement {
                cost, externality, ..
            } => Some(crate::observation::AttemptObservation {
                cost: *cost,
                externality: *externality,
            }),
            Statement::Absence { .. }
            | Statement::Fence { .. }
            | Statement::Observation { .. }
            | Statement::NotSent { .. }
            | Statement::Quiescence { .. }
            | Statement::Attachment { .. } => None,
        }
    }

    /// Whether the statement proves that no instance of `generation` runs
    /// and none will: an absence of exactly that generation, or a fence of
    /// that generation or a later one. A not-sent statement proves the
    /// command never ran, not that the instance is destroyed: it is not a
    /// destroy proof.
    pub fn proves_gone(&self, generation: i64) -> bool {
        match self {
            Statement::Absence { generation: g, .. } => *g == generation,
            Statement::Fence { generation: g, .. } => *g >= generation,
            Statement::Observation { .. }
            | Statement::NotSent { .. }
            | Statement::Quiescence { .. }
            | Statement::Attachment { .. }
            | Statement::Measurement { .. } => false,
        }
    }

    /// Whether the statement proves that the command of exactly
    /// `generation` never reached a supervisor and never will: a not-sent
    /// statement of that generation.
    pub fn proves_not_sent(&self, generation: i64) -> bool {
        matches!(self, Statement::NotSent { generation: g, .. } if *g == generation)
    }
}

/// One DSSE signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvelopeSignature {
    /// Lowercase hex SHA-256 of the signer's public key.
    pub keyid: String,
    /// Base64 of the 64-byte Ed25519 signature.
    pub sig: String,
}

/// A DSSE envelope; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// Always [`PAYLOAD_TYPE`] for evidence.
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    /// Base64 of the statement's canonical JSON.
    pub payload: String,
    /// Exactly one signature for evidence.
    pub signatures: Vec<EnvelopeSignature>,
}

/// What a verifier expects the statement to be about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected<'a> {
    /// The provider whose key verifies.
    pub provider_id: &'a str,
    /// The lease.
    pub lease_id: i64,
    /// The generation. An absence, observation or not-sent statement must
    /// name exactly it; a fence must name it or a later generation (a fence covers every
    /// generation up to its own).
    pub generation: i64,
}

/// A refused envelope. Codes are stable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvidenceError {
    /// The signature does not verify over the payload. Code `bad_signature`.
    #[error("the evidence signature does not verify")]
    BadSignature,
    /// The envelope is signed by another key than the provider's. Code `wrong_key`.
    #[error("the evidence is signed by key {0}, not the provider's")]
    WrongKey(String),
    /// The payload type is not [`PAYLOAD_TYPE`]. Code `wrong_payload_type`.
    #[error("payload type {0:?} is not evidence")]
    WrongPayloadType(String),
    /// The statement is about another provider, lease or generation. Code
    /// `evidence_mismatch`.
    #[error("the evidence is about {0}, not the expected lease generation")]
    Mismatch(String),
    /// Not a well-formed envelope or statement, or a payload that is not
    /// canonical JSON. Code `malformed_evidence`.
    #[error("malformed evidence: {0}")]
    Malformed(&'static str),
}

impl EvidenceError {
    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            EvidenceError::BadSignature => "bad_signature",
            EvidenceError::WrongKey(_) => "wrong_key",
            EvidenceError::WrongPayloadType(_) => "wrong_payload_type",
            EvidenceError::Mismatch(_) => "evidence_mismatch",
            EvidenceError::Malformed(_) => "malformed_evidence",
        }
    }
}

/// The DSSE pre-authentication encoding:
/// `"DSSEv1" SP len(type) SP type SP len(body) SP body`, lengths in ASCII
/// decimal bytes.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {} {} ",
        payload_type.len(),
        payload_type,
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

/// The key id of `key`: lowercase hex SHA-256 of its 32 bytes.
pub fn key_id(key: &VerifyingKey) -> String {
    hex::encode(sha256(key.as_bytes()))
}

/// The canonical (JCS) JSON bytes of `statement`.
pub fn canonical(statement: &Statement) -> Vec<u8> {
    // A statement holds only strings, integers, booleans and enum tags: JCS
    // cannot fail on it.
    serde_jcs::to_vec(statement).unwrap_or_default()
}

/// Signs `statement` with `key` into an envelope.
pub fn sign(statement: &Statement, key: &SigningKey) -> Envelope {
    let body = canonical(statement);
    let sig: Signature = key.sign(&pae(PAYLOAD_TYPE, &body));
    Envelope {
        payload_type: PAYLOAD_TYPE.to_owned(),
        payload: BASE64.encode(&body),
        signatures: vec![EnvelopeSignature {
            keyid: key_id(&key.verifying_key()),
            sig: BASE64.encode(sig.to_bytes()),
        }],
    }
}

/// Verifies `envelope` with `key` and returns its statement when it is about
/// `expected`.
///
/// # Errors
/// [`EvidenceError::WrongPayloadType`], [`EvidenceError::Malformed`] (not
/// one signature, bad base64, oversize, not a statement, not canonical),
/// [`EvidenceError::WrongKey`] for another key id,
/// [`EvidenceError::BadSignature`], [`EvidenceError::Mismatch`].
pub fn verify(
    envelope: &Envelope,
    key: &VerifyingKey,
    expected: Expected<'_>,
) -> Result<Statement, EvidenceError> {
    let statement = verify_signature(envelope, key)?;
    let (provider_id, lease_id, generation) = statement.subject();
    let generation_ok = match statement {
        Statement::Fence { .. } => generation >= expected.generation,
        _ => generation == expected.generation,
    };
    if provider_id != expected.provider_id || lease_id != expected.lease_id || !generation_ok {
        return Err(EvidenceError::Mismatch(format!(
            "{} of provider {provider_id:?} lease {lease_id} generation {generation}",
            statement.kind()
        )));
    }
    Ok(statement)
}

/// Verifies the envelope's signature with `key` and decodes the statement,
/// without checking what it is about.
///
/// # Errors
/// As [`verify`], except [`EvidenceError::Mismatch`].
pub fn verify_signature(
    envelope: &Envelope,
    key: &VerifyingKey,
) -> Result<Statement, EvidenceError> {
    if envelope.payload_type != PAYLOAD_TYPE {
        return Err(EvidenceError::WrongPayloadType(
            envelope.payload_type.chars().take(128).collect(),
        ));
    }
    let [signature] = envelope.signatures.as_slice() else {
        return Err(EvidenceError::Malformed(
            "evidence carries exactly one signature",
        ));
    };
    if envelope.payload.len() > PAYLOAD_B64_MAX {
        return Err(EvidenceError::Malformed("payload too large"));
    }
    let want_id = key_id(key);
    if signature.keyid != want_id {
        return Err(EvidenceError::WrongKey(
            signature.keyid.chars().take(64).collect(),
        ));
    }
    let body = BASE64
        .decode(envelope.payload.as_bytes())
        .map_err(|_| EvidenceError::Malformed("payload is not base64"))?;
    let sig_bytes: [u8; 64] = BASE64
        .decode(signature.sig.as_bytes())
        .map_err(|_| EvidenceError::Malformed("sig is not base64"))?
        .try_into()
        .map_err(|_| EvidenceError::Malformed("sig is not 64 bytes"))?;
    key.verify(
        &pae(&envelope.payload_type, &body),
        &Signature::from_bytes(&sig_bytes),
    )
    .map_err(|_| EvidenceError::BadSignature)?;
    let statement: Statement = serde_json::from_slice(&body)
        .map_err(|_| EvidenceError::Malformed("payload is not a statement"))?;
    if canonical(&statement) != body {
        return Err(EvidenceError::Malformed("payload is not canonical JSON"));
    }
    Ok(statement)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn absence(generation: i64) -> Statement {
        Statement::Absence {
            provider_id: "p1".into(),
            lease_id: 7,
            generation,
        }
    }

    fn expected(generation: i64) -> Expected<'static> {
        Expected {
            provider_id: "p1",
            lease_id: 7,
            generation,
        }
    }

    /// Re-signs `body` as if `key` produced it, for payloads sign() would
    /// never write.
    fn sign_raw(body: &[u8], key: &SigningKey) -> Envelope {
        let sig: Signature = key.sign(&pae(PAYLOAD_TYPE, body));
        Envelope {
            payload_type: PAYLOAD_TYPE.into(),
            payload: BASE64.encode(body),
            signatures: vec![EnvelopeSignature {
                keyid: key_id(&key.verifying_key()),
                sig: BASE64.encode(sig.to_bytes()),
            }],
        }
    }

    fn measurement(cost: Option<crate::observation::CostObservation>, network: bool) -> Statement {
        Statement::Measurement {
            provider_id: "p1".into(),
            lease_id: 7,
            generation: 2,
            cost,
            externality: crate::observation::ExternalityObservation::of_sandbox(network),
        }
    }

    #[test]
    fn a_measurement_omits_what_was_not_measured() {
        let cost = crate::observation::CostObservation {
            cpu_time_ms: 0,
            peak_memory_bytes: 1_048_576,
        };
        let measured = measurement(Some(cost), false);
        assert_eq!(
            String::from_utf8(canonical(&measured)).unwrap(),
            r#"{"cost":{"cpuTimeMs":0,"peakMemoryBytes":1048576},"externality":{"databaseCommits":false,"externalApiCalls":false,"networkWrites":false},"generation":2,"lease_id":7,"provider_id":"p1","statement":"measurement"}"#
        );
        let unknown = measurement(None, true);
        assert_eq!(
            String::from_utf8(canonical(&unknown)).unwrap(),
            r#"{"externality":{},"generation":2,"lease_id":7,"provider_id":"p1","statement":"measurement"}"#
        );
        assert_eq!(unknown.kind(), "measurement");
        assert_eq!(unknown.subject(), ("p1", 7, 2));
        assert!(!measured.proves_gone(2));
        assert!(!measured.proves_not_sent(2));
        assert_eq!(
            measured.measured(),
            Some(crate::observation::AttemptObservation {
                cost: Some(cost),
                externality: crate::observation::ExternalityObservation::no_network_path(),
            })
        );
        assert_eq!(absence(2).measured(), None);
        assert_eq!(
            unknown.measured(),
            Some(crate::observation::AttemptObservation {
                cost: None,
                externality: crate::observation::ExternalityObservation::absent(),
            })
        );
        let k = key(3);
        for st in [&measured, &unknown] {
            assert_eq!(
                verify(&sign(st, &k), &k.verifying_key(), expected(2)).as_ref(),
                Ok(st)
            );
            assert_eq!(
                verify(&sign(st, &k), &k.verifying_key(), expected(3))
                    .unwrap_err()
                    .code(),
                "evidence_mismatch"
            );
        }
        // An explicit null is a second encoding of "not measured": refused.
        let null_cost = br#"{"cost":null,"externality":{},"generation":2,"lease_id":7,"provider_id":"p1","statement":"measurement"}"#;
        assert_eq!(
            verify(&sign_raw(null_cost, &k), &k.verifying_key(), expected(2)),
            Err(EvidenceError::Malformed("payload is not canonical JSON"))
        );
        let null_flag = br#"{"externality":{"networkWrites":null},"generation":2,"lease_id":7,"provider_id":"p1","statement":"measurement"}"#;
        assert_eq!(
            verify(&sign_raw(null_flag, &k), &k.verifying_key(), expected(2)),
            Err(EvidenceError::Malformed("payload is not a statement"))
        );
    }

    #[test]
    fn pae_is_exact() {
        assert_eq!(pae("ab", b"xyz"), b"DSSEv1 2 ab 3 xyz".to_vec());
        assert_eq!(pae("", b""), b"DSSEv1 0  0 ".to_vec());
    }

    #[test]
    fn canonical_form_is_exact() {
        assert_eq!(
            String::from_utf8(canonical(&absence(1))).unwrap(),
            r#"{"generation":1,"lease_id":7,"provider_id":"p1","statement":"absence"}"#
        );
        let obs = Statement::Observation {
            provider_id: "p1".into(),
            lease_id: 7,
            generation: 2,
            state: InstanceState::Running,
        };
        assert_eq!(
            String::from_utf8(canonical(&obs)).unwrap(),
            r#"{"generation":2,"lease_id":7,"provider_id":"p1","state":"running","statement":"observation"}"#
        );
    }

    #[test]
    fn signed_envelope_is_exact_and_verifies() {
        let k = key(7);
        let env = sign(&absence(1), &k);
        assert_eq!(env.payload_type, PAYLOAD_TYPE);
        assert_eq!(
            env.payload,
            BASE64.encode(
                br#"{"generation":1,"lease_id":7,"provider_id":"p1","statement":"absence"}"#
            )
        );
        assert_eq!(env.signatures[0].keyid, key_id(&k.verifying_key()));
        assert_eq!(
            env.signatures[0].keyid,
            hex::encode(sha256(k.verifying_key().as_bytes()))
        );
        assert_eq!(
            env.signatures[0].keyid,
            "fe812c12f3ab4ce6ac5db69ac352f906cb1b11ef43fb33e252ef7ff552263889"
        );
        assert_eq!(
            env.signatures[0].sig,
            "soddAprZL/rvoHXv1vjV8w4zzFgZfUZkiDYvawsAsmNvogS7AT+qgoZxGRzG8zshmiNGKYd1R+zxVV8l0IrtDg=="
        );
        // Ed25519 is deterministic: the same key and statement give the same envelope.
        assert_eq!(sign(&absence(1), &k), env);
        let json = serde_json::to_value(&env).unwrap();
        assert_eq!(
            json.as_object().unwrap().keys().collect::<Vec<_>>(),
            vec!["payload", "payloadType", "signatures"]
        );
        assert_eq!(
            verify(&env, &k.verifying_key(), expected(1)).unwrap(),
            absence(1)
        );
    }

    #[test]
    fn tampered_payload_is_a_bad_signature() {
        let k = key(7);
        let mut env = sign(&absence(1), &k);
        env.payload = BASE64.encode(canonical(&absence(2)));
        assert_eq!(
            verify(&env, &k.verifying_key(), expected(2)).unwrap_err(),
            EvidenceError::BadSignature
        );
        let mut env = sign(&absence(1), &k);
        let mut sig = BASE64.decode(&env.signatures[0].sig).unwrap();
        sig[0] ^= 1;
        env.signatures[0].sig = BASE64.encode(sig);
        assert_eq!(
            verify(&env, &k.verifying_key(), expected(1))
                .unwrap_err()
                .code(),
            "bad_signature"
        );
    }

    #[test]
    fn another_key_is_refused() {
        let env = sign(&absence(1), &key(7));
        assert_eq!(
            verify(&env, &key(8).verifying_key(), expected(1))
                .unwrap_err()
                .code(),
            "wrong_key"
        );
        // A forged key id with another key's signature still fails the signature.
        let mut forged = sign(&absence(1), &key(8));
        forged.signatures[0].keyid = key_id(&key(7).verifying_key());
        assert_eq!(
            verify(&forged, &key(7).verifying_key(), expected(1)).unwrap_err(),
            EvidenceError::BadSignature
        );
    }

    #[test]
    fn wrong_lease_generation_or_provider_is_a_mismatch() {
        let k = key(7);
        let vk = k.verifying_key();
        let env = sign(&absence(2), &k);
        for exp in [
            expected(1),
            expected(3),
            Expected {
                lease_id: 8,
                ..expected(2)
            },
            Expected {
                provider_id: "p2",
                ..expected(2)
            },
        ] {
            assert_eq!(
                verify(&env, &vk, exp).unwrap_err().code(),
                "evidence_mismatch"
            );
        }
        let fence = sign(
            &Statement::Fence {
                provider_id: "p1".into(),
                lease_id: 7,
                generation: 2,
            },
            &k,
        );
        assert!(verify(&fence, &vk, expected(1)).is_ok());
        assert!(verify(&fence, &vk, expected(2)).is_ok());
        assert_eq!(
            verify(&fence, &vk, expected(3)).unwrap_err().code(),
            "evidence_mismatch"
        );
    }

    #[test]
    fn malformed_envelopes_are_refused() {
        let k = key(7);
        let vk = k.verifying_key();
        let mut env = sign(&absence(1), &k);
        env.payload_type = "text/plain".into();
        assert_eq!(
            verify(&env, &vk, expected(1)).unwrap_err().code(),
            "wrong_payload_type"
        );
        let mut env = sign(&absence(1), &k);
        env.signatures.clear();
        assert_eq!(
            verify(&env, &vk, expected(1)).unwrap_err().code(),
            "malformed_evidence"
        );
        let mut env = sign(&absence(1), &k);
        env.signatures.push(env.signatures[0].clone());
        assert_eq!(
            verify(&env, &vk, expected(1)).unwrap_err().code(),
            "malformed_evidence"
        );
        // Correctly signed, but not canonical: key order and spacing differ.
        let loose = sign_raw(
            br#"{"statement":"absence","provider_id":"p1","lease_id":7,"generation":1}"#,
            &k,
        );
        assert_eq!(
            verify(&loose, &vk, expected(1)).unwrap_err(),
            EvidenceError::Malformed("payload is not canonical JSON")
        );
        let junk = sign_raw(b"not json", &k);
        assert_eq!(
            verify(&junk, &vk, expected(1)).unwrap_err().code(),
            "malformed_evidence"
        );
        let mut env = sign(&absence(1), &k);
        env.payload = "!!".into();
        assert_eq!(
            verify(&env, &vk, expected(1)).unwrap_err().code(),
            "malformed_evidence"
        );
    }

    fn not_sent(generation: i64) -> Statement {
        Statement::NotSent {
            provider_id: "p1".into(),
            lease_id: 7,
            generation,
        }
    }

    #[test]
    fn not_sent_envelope_is_exact_and_verifies_for_its_generation_only() {
        let k = key(7);
        let vk = k.verifying_key();
        assert_eq!(
            String::from_utf8(canonical(&not_sent(2))).unwrap(),
            r#"{"generation":2,"lease_id":7,"provider_id":"p1","statement":"not_sent"}"#
        );
        let env = sign(&not_sent(2), &k);
        assert_eq!(
            env.payload,
            BASE64.encode(
                br#"{"generation":2,"lease_id":7,"provider_id":"p1","statement":"not_sent"}"#
            )
        );
        assert_eq!(
            env.signatures[0].keyid,
            "fe812c12f3ab4ce6ac5db69ac352f906cb1b11ef43fb33e252ef7ff552263889"
        );
        assert_eq!(
            env.signatures[0].sig,
            "FGRAIvK/yuJy3+jZUdXXB0Ag5g4BiVy2nrOKNodRmZLMcoIlWM8k3g+qJ1eFY7FKt0YX5oQOJC5+r0f7z/QODQ=="
        );
        assert_eq!(verify(&env, &vk, expected(2)).unwrap(), not_sent(2));
        assert_eq!(not_sent(2).kind(), "not_sent");
        // Exactly its generation: unlike a fence, it covers no other.
        for g in [1, 3] {
            assert_eq!(
                verify(&env, &vk, expected(g)).unwrap_err().code(),
                "evidence_mismatch"
            );
        }
        assert!(not_sent(2).proves_not_sent(2));
        assert!(!not_sent(2).proves_not_sent(1));
        assert!(!not_sent(2).proves_not_sent(3));
        // It is no destroy proof, and no other statement proves not-sent.
        assert!(!not_sent(2).proves_gone(2));
        let fence = Statement::Fence {
            provider_id: "p1".into(),
            lease_id: 7,
            generation: 2,
        };
        assert!(!fence.proves_not_sent(2));
        assert!(!absence(2).proves_not_sent(2));
    }

    #[test]
    fn proves_gone_follows_the_fence_rule() {
        assert!(absence(2).proves_gone(2));
        assert!(!absence(2).proves_gone(1));
        let fence = Statement::Fence {
            provider_id: "p1".into(),
            lease_id: 7,
            generation: 2,
        };
        assert!(fence.proves_gone(1));
        assert!(fence.proves_gone(2));
        assert!(!fence.proves_gone(3));
    }

    #[test]
    fn quiescence_and_attachment_are_exact_and_prove_nothing_gone() {
        let head = "ab".repeat(32);
        let q = Statement::Quiescence {
            provider_id: "p1".into(),
            lease_id: 7,
            generation: 2,
            workspace_id: 9,
            head: head.clone(),
        };
        assert_eq!(
            String::from_utf8(canonical(&q)).unwrap(),
            format!(
                r#"{{"generation":2,"head":"{head}","lease_id":7,"provider_id":"p1","statement":"quiescence","workspace_id":9}}"#
            )
        );
        let a = Statement::Attachment {
            provider_id: "p1".into(),
            lease_id: 7,
            generation: 3,
            workspace_id: 9,
            head: head.clone(),
            writable: true,
        };
        assert_eq!(
            String::from_utf8(canonical(&a)).unwrap(),
            format!(
                r#"{{"generation":3,"head":"{head}","lease_id":7,"provider_id":"p1","statement":"attachment","workspace_id":9,"writable":true}}"#
            )
        );
        assert_eq!((q.kind(), a.kind()), ("quiescence", "attachment"));
        assert_eq!(q.subject(), ("p1", 7, 2));
        assert_eq!(a.subject(), ("p1", 7, 3));
        for g in 1..=3 {
            assert!(!q.proves_gone(g) && !a.proves_gone(g));
            assert!(!q.proves_not_sent(g) && !a.proves_not_sent(g));
        }
        let k = key(7);
        assert_eq!(
            verify(&sign(&a, &k), &k.verifying_key(), expected(3)),
            Ok(a.clone())
        );
        assert_eq!(
            verify(&sign(&a, &k), &k.verifying_key(), expected(2))
                .unwrap_err()
                .code(),
            "evidence_mismatch"
        );
        assert_eq!(
            verify(&sign(&q, &key(8)), &k.verifying_key(), expected(2))
                .unwrap_err()
                .code(),
            "wrong_key"
        );
    }
}
