//! Secret strings from a config.

use serde::{Deserialize, Serialize};

/// A secret string from the config: serialized as itself, shown as
/// `<redacted>` by Debug so a logged config never carries it.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl Secret {
    /// The secret itself.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for Secret {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret(s)
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Secret(s.to_string())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::Secret;

    #[test]
    fn debug_redacts_and_serde_is_transparent() {
        let s = Secret::from("hunter2");
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(&*s, "hunter2");
        #[derive(serde::Serialize)]
        struct C {
            k: Secret,
        }
        let text = toml::to_string(&C { k: s }).expect("serializes");
        assert_eq!(text.trim(), "k = \"hunter2\"");
    }
}
