//! `sluice <role> --print-config`: every key a role's config file accepts,
//! with its default, so operators (and `sluice-bench soak`, which writes
//! role configs) need not read the source or guess.
//!
//! The key list comes from the config type's `Deserialize` impl
//! (serde-aux's `serde_introspect`: the field names serde matches,
//! renames applied), so it is the set `deny_unknown_fields` accepts; the
//! values come from `Default`. Keys without a default (`Option` fields that
//! are unset) are printed commented out in TOML and as `null` in JSON.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Output of `--print-config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ConfigFormat {
    /// A config file to start from: keys in alphabetical order, tables
    /// last, keys without a default as `# key =` comments.
    Toml,
    /// One JSON object of every key; keys without a default are `null`.
    Json,
}

/// Renders `config` (normally `T::default()`) with every key of `T`.
///
/// # Errors
/// When the config cannot be represented in the format (a bug in the
/// config type's `Serialize`).
pub fn render<T>(config: &T, format: ConfigFormat) -> anyhow::Result<String>
where
    T: Serialize + DeserializeOwned,
{
    let mut value = serde_json::to_value(config)?;
    let object = value
        .as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("a config serializes to a map"))?;
    for key in serde_aux::serde_introspection::serde_introspect::<T>() {
        object
            .entry(key.to_string())
            .or_insert(serde_json::Value::Null);
    }
    match format {
        ConfigFormat::Json => Ok(serde_json::to_string_pretty(&value)? + "\n"),
        ConfigFormat::Toml => {
            let unset: Vec<String> = object
                .iter()
                .filter(|(_, v)| v.is_null())
                .map(|(k, _)| k.clone())
                .collect();
            object.retain(|_, v| !v.is_null());
            let mut out = String::new();
            for key in &unset {
                out.push_str(&format!("# {key} =\n"));
            }
            if !unset.is_empty() {
                out.push('\n');
            }
            // toml::Value writes plain keys before tables, as TOML needs.
            out.push_str(&toml::to_string(&toml::Value::try_from(&value)?)?);
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every role's printed TOML is a config the role accepts, equal to
    /// its default, and the JSON lists exactly the keys serde accepts.
    fn round_trips<T>()
    where
        T: Serialize + DeserializeOwned + Default + PartialEq + std::fmt::Debug,
    {
        let text = render(&T::default(), ConfigFormat::Toml).expect("toml");
        let parsed: T = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(parsed, T::default());
        let json: serde_json::Value =
            serde_json::from_str(&render(&T::default(), ConfigFormat::Json).expect("json"))
                .expect("valid JSON");
        let mut keys: Vec<&str> = json
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        let mut fields = serde_aux::serde_introspection::serde_introspect::<T>().to_vec();
        fields.sort_unstable();
        assert_eq!(keys, fields);
    }

    #[test]
    fn every_role_prints_a_config_it_accepts() {
        round_trips::<sluice_meta::Config>();
        round_trips::<sluice_datanode::Config>();
        round_trips::<sluice_gateway::Config>();
    }

    #[test]
    fn keys_without_a_default_are_listed() {
        let json: serde_json::Value = serde_json::from_str(
            &render(&sluice_gateway::Config::default(), ConfigFormat::Json).expect("json"),
        )
        .expect("valid JSON");
        // Optional budgets: unset by default, still accepted keys.
        assert!(json["buffer_budget_bytes"].is_null());
        assert!(json["write_quorum"].is_null());
        assert_eq!(json["data_shards"], 4);
        let text = render(&sluice_gateway::Config::default(), ConfigFormat::Toml).expect("toml");
        assert!(
            text.lines().any(|l| l == "# buffer_budget_bytes ="),
            "{text}"
        );
        assert!(text.lines().any(|l| l == "data_shards = 4"), "{text}");
    }
}
