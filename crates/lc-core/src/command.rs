//! Command lines: the argv an exec runs, checked before anything is
//! written. `env` is not supported yet: the instance's environment is the
//! supervisor's fixed one.

use serde::{Deserialize, Serialize};

use crate::error::LcError;

/// The most arguments, `argv[0]` included.
pub const ARGV_MAX: usize = 256;
/// The longest argument, in bytes.
pub const ARG_BYTES_MAX: usize = 4096;
/// The most bytes of all arguments together.
pub const ARGV_BYTES_MAX: usize = 64 * 1024;

/// A checked argv: 1..=[`ARGV_MAX`] strings, `argv[0]` non-empty, no NUL,
/// each at most [`ARG_BYTES_MAX`] bytes, together at most
/// [`ARGV_BYTES_MAX`]. The field is private so every value is valid.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Command(Vec<String>);

impl Command {
    /// Checks and wraps `argv`.
    ///
    /// # Errors
    /// [`LcError::InvalidCommand`] naming the first rule broken.
    pub fn new(argv: Vec<String>) -> Result<Command, LcError> {
        let bad = |reason: String| Err(LcError::InvalidCommand { reason });
        if argv.is_empty() {
            return bad("the command needs at least one argument".into());
        }
        if argv.len() > ARGV_MAX {
            return bad(format!("{} arguments; at most {ARGV_MAX}", argv.len()));
        }
        if argv[0].is_empty() {
            return bad("argv[0] is empty".into());
        }
        let mut total: usize = 0;
        for (i, a) in argv.iter().enumerate() {
            if a.as_bytes().contains(&0) {
                return bad(format!("argv[{i}] contains a NUL byte"));
            }
            if a.len() > ARG_BYTES_MAX {
                return bad(format!(
                    "argv[{i}] is {} bytes; at most {ARG_BYTES_MAX}",
                    a.len()
                ));
            }
            total += a.len();
        }
        if total > ARGV_BYTES_MAX {
            return bad(format!(
                "the arguments are {total} bytes together; at most {ARGV_BYTES_MAX}"
            ));
        }
        Ok(Command(argv))
    }

    /// The arguments.
    pub fn argv(&self) -> &[String] {
        &self.0
    }

    /// The arguments, owned.
    pub fn into_argv(self) -> Vec<String> {
        self.0
    }
}

impl<'de> Deserialize<'de> for Command {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let argv = Vec::<String>::deserialize(d)?;
        Command::new(argv).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn accepts_ordinary_commands() {
        let c = Command::new(argv(&["sh", "-c", "echo hi"])).unwrap();
        assert_eq!(c.argv(), ["sh", "-c", "echo hi"]);
        // Empty later arguments are fine.
        Command::new(argv(&["printf", ""])).unwrap();
    }

    #[test]
    fn refuses_each_broken_rule() {
        let code = |v: Vec<String>| Command::new(v).unwrap_err().code();
        assert_eq!(code(vec![]), "invalid_command");
        assert_eq!(code(argv(&[""])), "invalid_command");
        assert_eq!(code(argv(&["a\0b"])), "invalid_command");
        assert_eq!(code(vec!["x".into(); ARGV_MAX + 1]), "invalid_command");
        Command::new(vec!["x".into(); ARGV_MAX]).unwrap();
        assert_eq!(code(vec!["y".repeat(ARG_BYTES_MAX + 1)]), "invalid_command");
        Command::new(vec!["y".repeat(ARG_BYTES_MAX)]).unwrap();
        // 17 arguments of 4096 bytes = 69632 > 65536; 16 fit exactly.
        assert_eq!(code(vec!["z".repeat(ARG_BYTES_MAX); 17]), "invalid_command");
        Command::new(vec!["z".repeat(ARG_BYTES_MAX); 16]).unwrap();
    }

    fn check(v: Vec<String>, expect: Result<&[&str], &str>) {
        let got = Command::new(v.clone());
        match expect {
            Ok(want) => {
                let c = got.unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(c.argv(), want);
                assert_eq!(c.into_argv(), v);
            }
            Err(reason) => assert_eq!(
                got,
                Err(LcError::InvalidCommand {
                    reason: reason.into()
                })
            ),
        }
    }

    #[test]
    fn bounds_are_exact() {
        assert_eq!(
            (ARGV_MAX, ARG_BYTES_MAX, ARGV_BYTES_MAX),
            (256, 4096, 65_536)
        );
        check(vec![], Err("the command needs at least one argument"));
        check(argv(&["x"]), Ok(&["x"]));
        check(argv(&[""]), Err("argv[0] is empty"));
        check(argv(&["x", ""]), Ok(&["x", ""]));
        check(argv(&["x", "a\0"]), Err("argv[1] contains a NUL byte"));
        // argv[0] is checked for emptiness before any NUL.
        check(argv(&["", "\0"]), Err("argv[0] is empty"));

        let x256 = vec!["x"; 256];
        check(x256.iter().map(|s| s.to_string()).collect(), Ok(&x256));
        check(vec!["x".into(); 257], Err("257 arguments; at most 256"));

        let a4096 = "a".repeat(4096);
        check(vec![a4096.clone()], Ok(&[a4096.as_str()]));
        check(
            vec!["x".into(), "a".repeat(4097)],
            Err("argv[1] is 4097 bytes; at most 4096"),
        );
        // Bytes, not characters: 2048 two-byte characters fit, one more
        // does not.
        let e2048 = "é".repeat(2048);
        check(vec![e2048.clone()], Ok(&[e2048.as_str()]));
        check(
            vec!["é".repeat(2049)],
            Err("argv[0] is 4098 bytes; at most 4096"),
        );

        // 16 arguments of 4096 bytes are 65536 bytes, exactly the bound.
        let full = vec![a4096.as_str(); 16];
        check(vec![a4096.clone(); 16], Ok(&full));
        // One byte more, spread as a 17th argument, is refused.
        let mut over = vec![a4096.clone(); 16];
        over.push("b".into());
        check(
            over,
            Err("the arguments are 65537 bytes together; at most 65536"),
        );
    }

    #[test]
    fn deserializing_checks_like_new() {
        let c: Command = serde_json::from_str(r#"["sh","-c","echo hi"]"#).unwrap();
        assert_eq!(c.into_argv(), argv(&["sh", "-c", "echo hi"]));
        assert_eq!(
            serde_json::to_string(&Command::new(argv(&["a", "b"])).unwrap()).unwrap(),
            r#"["a","b"]"#
        );
        assert_eq!(
            serde_json::from_str::<Command>("[]")
                .unwrap_err()
                .to_string(),
            "invalid command: the command needs at least one argument"
        );
        assert_eq!(
            serde_json::from_str::<Command>(r#"[""]"#)
                .unwrap_err()
                .to_string(),
            "invalid command: argv[0] is empty"
        );
    }
}
