//! [`Headers`]: a message's record headers in the one form they keep from
//! the writer to the Kafka record. The outbox stores them as their JSON
//! object (`json` column, the text exactly as written here); the publisher
//! reads that object back into this type and the Kafka transport turns it
//! into the record's header map.

use std::{borrow::Cow, collections::BTreeMap};

/// Header name → UTF-8 value, sorted by name (unique names, as Kafka
/// record headers are in rskafka). Names the worker writes are `'static`,
/// so building a message allocates only the values.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(transparent)]
pub struct Headers(BTreeMap<Cow<'static, str>, String>);

impl Headers {
    /// Headers from static names and their values.
    pub fn from_static(pairs: impl IntoIterator<Item = (&'static str, String)>) -> Self {
        Self(
            pairs
                .into_iter()
                .map(|(name, value)| (Cow::Borrowed(name), value))
                .collect(),
        )
    }

    /// Sets `name` to `value`.
    pub fn insert(&mut self, name: &'static str, value: String) {
        self.0.insert(Cow::Borrowed(name), value);
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Name and value, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0
            .iter()
            .map(|(name, value)| (name.as_ref(), value.as_str()))
    }

    /// These headers less the ones `drop` names.
    pub fn without(&self, drop: impl Fn(&str) -> bool) -> Self {
        Self(
            self.0
                .iter()
                .filter(|(name, _)| !drop(name))
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect(),
        )
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The JSON object the outbox stores.
    pub fn to_json(&self) -> String {
        // A map of strings to strings always serialises.
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }

    /// Reads the JSON object the outbox stores. A value that is not a
    /// string (never written by the worker) is kept as its JSON text rather
    /// than dropped; anything but an object is an error naming what it is.
    pub fn from_json(text: &[u8]) -> Result<Self, String> {
        let value: serde_json::Value = serde_json::from_slice(text)
            .map_err(|e| format!("the row's headers are not JSON: {e}"))?;
        let serde_json::Value::Object(map) = value else {
            return Err(format!(
                "the row's headers are not a JSON object: {}",
                truncate(&value.to_string(), 80)
            ));
        };
        Ok(Self(
            map.into_iter()
                .map(|(name, value)| {
                    let value = match value {
                        serde_json::Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (Cow::Owned(name), value)
                })
                .collect(),
        ))
    }
}

/// At most `max` characters of `text`.
fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

impl<'a> FromIterator<(&'a str, &'a str)> for Headers {
    fn from_iter<I: IntoIterator<Item = (&'a str, &'a str)>>(pairs: I) -> Self {
        Self(
            pairs
                .into_iter()
                .map(|(name, value)| (Cow::Owned(name.to_owned()), value.to_owned()))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_object_reads_back_as_written() {
        let headers = Headers::from_static([
            ("ce_id", "a".to_owned()),
            ("b", "\"quoted\" \\ é".to_owned()),
        ]);
        let json = headers.to_json();
        assert_eq!(json, r#"{"b":"\"quoted\" \\ é","ce_id":"a"}"#);
        assert_eq!(Headers::from_json(json.as_bytes()), Ok(headers));
    }

    #[test]
    fn other_values_are_kept_as_text_and_non_objects_refused() {
        let read = Headers::from_json(br#"{"n":1,"s":"x","o":{"a":true}}"#).unwrap();
        assert_eq!(read.get("n"), Some("1"));
        assert_eq!(read.get("s"), Some("x"));
        assert_eq!(read.get("o"), Some(r#"{"a":true}"#));
        let error = Headers::from_json(b"[1,2]").unwrap_err();
        assert!(error.contains("not a JSON object: [1,2]"), "{error}");
        assert!(Headers::from_json(b"{").unwrap_err().contains("not JSON"));
    }
}
