//! Test support (feature `testkit`): errors as the server sends them, for
//! the unit tests of a store's error mapping.

use std::borrow::Cow;
use std::error::Error;
use std::fmt;

/// A server error with SQLSTATE `sqlstate` and text `message`, delivered
/// as sqlx delivers one (`sqlx::Error::Database`).
pub fn database_error(sqlstate: &'static str, message: &'static str) -> sqlx::Error {
    sqlx::Error::Database(Box::new(ServerError { sqlstate, message }))
}

#[derive(Debug)]
struct ServerError {
    sqlstate: &'static str,
    message: &'static str,
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message)
    }
}

impl Error for ServerError {}

impl sqlx::error::DatabaseError for ServerError {
    fn message(&self) -> &str {
        self.message
    }
    fn code(&self) -> Option<Cow<'_, str>> {
        Some(self.sqlstate.into())
    }
    fn as_error(&self) -> &(dyn Error + Send + Sync + 'static) {
        self
    }
    fn as_error_mut(&mut self) -> &mut (dyn Error + Send + Sync + 'static) {
        self
    }
    fn into_error(self: Box<Self>) -> Box<dyn Error + Send + Sync + 'static> {
        self
    }
    fn kind(&self) -> sqlx::error::ErrorKind {
        sqlx::error::ErrorKind::Other
    }
}
