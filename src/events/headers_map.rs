//! [`Headers`]: a message's record headers in the one form they keep from
//! the writer to the Kafka record. The outbox stores them as their JSON
//! object (`json` column, the text exactly as written here); the publisher
//! reads that object back into this type and the Kafka transport turns it
//! into the record's header map.

use std::{borrow::Cow, collections::BTreeMap};

use booking_expired_proto::headers;

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
    ///
    /// Read straight into the map (the publisher reads every row's headers
    /// once): the names the worker writes come back as their `'static`
    /// strings, so a record's headers cost only their values.
    pub fn from_json(text: &[u8]) -> Result<Self, String> {
        match serde_json::from_slice::<Self>(text) {
            Ok(headers) => Ok(headers),
            Err(_) => Err(Self::describe_refusal(text)),
        }
    }

    /// Why `text` is not a headers object, in words.
    fn describe_refusal(text: &[u8]) -> String {
        match serde_json::from_slice::<serde_json::Value>(text) {
            Err(e) => format!("the row's headers are not JSON: {e}"),
            Ok(value) => format!(
                "the row's headers are not a JSON object: {}",
                truncate(&value.to_string(), 80)
            ),
        }
    }

    /// Name and value, owned, in name order (the transport's record
    /// headers are built from them without copying the values).
    pub fn into_pairs(self) -> impl Iterator<Item = (String, String)> {
        self.0
            .into_iter()
            .map(|(name, value)| (name.into_owned(), value))
    }
}

/// `name` as the worker's own `'static` name when it is one.
fn name_of(name: &str) -> Cow<'static, str> {
    headers::ALL
        .iter()
        .find(|known| **known == name)
        .map_or_else(
            || Cow::Owned(name.to_owned()),
            |known| Cow::Borrowed(*known),
        )
}

/// A header name as read.
struct Name(Cow<'static, str>);

impl<'de> serde::Deserialize<'de> for Name {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Name;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a header name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Name, E> {
                Ok(Name(name_of(name)))
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

impl<'de> serde::Deserialize<'de> for Headers {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Headers;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object of headers")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut entries: A,
            ) -> Result<Headers, A::Error> {
                let mut map = BTreeMap::new();
                while let Some(Name(name)) = entries.next_key()? {
                    let value = match entries.next_value::<serde_json::Value>()? {
                        serde_json::Value::String(s) => s,
                        other => other.to_string(),
                    };
                    map.insert(name, value);
                }
                Ok(Headers(map))
            }
        }
        deserializer.deserialize_map(Visitor)
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
                .map(|(name, value)| (name_of(name), value.to_owned()))
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
    fn the_workers_names_read_back_as_its_own_and_others_as_written() {
        let read =
            Headers::from_json(br#"{"ce_id":"a","c\u0065_type":"t","x-other":"o","ce_id":"b"}"#)
                .unwrap();
        let names: Vec<(&str, bool)> = read
            .0
            .keys()
            .map(|name| (name.as_ref(), matches!(name, Cow::Borrowed(_))))
            .collect();
        assert_eq!(
            names,
            [("ce_id", true), ("ce_type", true), ("x-other", false)]
        );
        // A repeated name keeps its last value, as a JSON object reads.
        assert_eq!(read.get("ce_id"), Some("b"));
        let pairs: Vec<(String, String)> = read.into_pairs().collect();
        assert_eq!(pairs[0], ("ce_id".to_owned(), "b".to_owned()));
        assert_eq!(pairs.len(), 3);
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
