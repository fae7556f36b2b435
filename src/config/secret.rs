//! A secret setting (`KAFKA_SASL_PASSWORD`): its `Debug` shows `***` and it
//! has no `Display`, so no `{:?}` of the arguments or settings that hold it
//! (a log line, a panic message) can print it.

use std::fmt;

#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn into_inner(self) -> String {
        self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// The clap value parser of a secret: any text.
pub fn parse(raw: &str) -> Result<Secret, String> {
    Ok(Secret::new(raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_secret() {
        let secret = Secret::new("hunter2-s3cret");
        assert_eq!(format!("{secret:?}"), "***");
        assert_eq!(format!("{:?}", Some(&secret)), "Some(***)");
        assert_eq!(secret.expose(), "hunter2-s3cret");
    }
}
