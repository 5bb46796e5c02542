//! Where each configuration value came from, and the layered resolution that records it:
//! defaults, then the image, then the config partition, then the kernel command line (later
//! layers override earlier ones). The console's `config` shows the result; PID 1 builds the
//! layers it has (h-image's config partition feeds [`Origin::ConfigPartition`]).

use crate::{keys, Config, ConfigError};

/// Where a value came from, lowest precedence first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Origin {
    /// Built in (`Config::default()`).
    Default,
    /// The image's configuration (written by `cargo xtask image`).
    Image,
    /// The config partition.
    ConfigPartition,
    /// `ringstore.KEY=VALUE` on the kernel command line.
    KernelCmdline,
    /// Sized by PID 1 from the machine, no layer having set it (the appliance's `memory`).
    Machine,
}

impl Origin {
    /// The stable name the console shows (text and JSON).
    pub fn name(self) -> &'static str {
        match self {
            Origin::Default => "default",
            Origin::Image => "image",
            Origin::ConfigPartition => "config-partition",
            Origin::KernelCmdline => "kernel-cmdline",
            Origin::Machine => "machine",
        }
    }
}

/// One layer: its origin and its `(key, value)` pairs in order (a key may repeat; the last wins).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    pub origin: Origin,
    pub pairs: Vec<(String, String)>,
}

/// One key of the effective configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// Canonical key name (dashes).
    pub key: &'static str,
    /// The value as it was given; for a default, the default from the key's help text
    /// (`(default X)`), else `built-in`.
    pub value: String,
    pub origin: Origin,
}

/// The effective configuration and where each key's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub config: Config,
    /// Every visible key (and every hidden key that a layer set), in [`crate::KEYS`] order.
    pub settings: Vec<Setting>,
}

/// Applies `layers` over the defaults in precedence order (whatever order they are given in),
/// validates, and records each key's origin. A bad value is the layer's error with its key.
pub fn resolve(layers: &[Layer]) -> Result<Resolved, ConfigError> {
    let mut ordered: Vec<&Layer> = layers.iter().collect();
    ordered.sort_by_key(|l| l.origin);
    let mut config = Config::default();
    let mut set: Vec<(&'static str, String, Origin)> = Vec::new();
    for layer in ordered {
        for (key, value) in &layer.pairs {
            config.set(key, value)?;
            let name = keys::find(&key.replace('_', "-")).map_or("?", |k| k.name);
            set.retain(|(k, _, _)| *k != name);
            set.push((name, value.clone(), layer.origin));
        }
    }
    config.validate()?;
    let settings = crate::KEYS
        .iter()
        .filter_map(|info| match set.iter().find(|(k, _, _)| *k == info.name) {
            Some((_, value, origin)) => Some(Setting {
                key: info.name,
                value: value.clone(),
                origin: *origin,
            }),
            None if info.hidden => None,
            None => Some(Setting {
                key: info.name,
                value: default_text(info.help),
                origin: Origin::Default,
            }),
        })
        .collect();
    Ok(Resolved { config, settings })
}

fn default_text(help: &str) -> String {
    help.split_once("(default ")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map_or_else(|| "built-in".to_string(), |(v, _)| v.to_string())
}

/// The `ringstore.KEY=VALUE` pairs of a kernel command line, in order (other tokens ignored).
pub fn kernel_cmdline_pairs(cmdline: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let mut pairs = Vec::new();
    for token in cmdline.split_whitespace() {
        let Some(setting) = token.strip_prefix("ringstore.") else {
            continue;
        };
        match setting.split_once('=') {
            Some((key, value)) => {
                pairs.push((key.to_string(), value.trim_matches('"').to_string()))
            }
            None => {
                let expected = keys::find(&setting.replace('_', "-"))
                    .map(|info| info.expected.to_string())
                    .unwrap_or_else(|| "KEY=VALUE".to_string());
                return Err(ConfigError::MissingValue {
                    key: setting.to_string(),
                    expected,
                });
            }
        }
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(origin: Origin, pairs: &[(&str, &str)]) -> Layer {
        Layer {
            origin,
            pairs: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn origin_of(r: &Resolved, key: &str) -> (String, Origin) {
        let s = r.settings.iter().find(|s| s.key == key).unwrap();
        (s.value.clone(), s.origin)
    }

    #[test]
    fn later_layers_win_and_each_value_names_its_origin() {
        let cmdline =
            kernel_cmdline_pairs("console=ttyS0 ringstore.cores=2 ringstore.memory=\"64m\"")
                .unwrap();
        let layers = [
            layer(
                Origin::KernelCmdline,
                &cmdline
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect::<Vec<_>>(),
            ),
            layer(
                Origin::Image,
                &[("cores", "1"), ("memcache", "0.0.0.0:11311")],
            ),
            layer(Origin::ConfigPartition, &[("memcache", "0.0.0.0:11411")]),
        ];
        let r = resolve(&layers).unwrap();
        assert_eq!(r.config.cores, 2);
        assert_eq!(origin_of(&r, "cores"), ("2".into(), Origin::KernelCmdline));
        assert_eq!(
            origin_of(&r, "memory"),
            ("64m".into(), Origin::KernelCmdline)
        );
        assert_eq!(
            origin_of(&r, "memcache"),
            ("0.0.0.0:11411".into(), Origin::ConfigPartition)
        );
        assert_eq!(
            origin_of(&r, "http"),
            ("0.0.0.0:8080".into(), Origin::Default)
        );
        assert_eq!(r.config.memcache, "0.0.0.0:11411".parse().ok());
        assert!(r.settings.iter().all(|s| !s.value.is_empty()));
        // Only defaults: every visible key listed once.
        let d = resolve(&[]).unwrap();
        assert_eq!(d.config, Config::default());
        assert!(d.settings.iter().all(|s| s.origin == Origin::Default));
        assert_eq!(
            d.settings.len(),
            crate::KEYS.iter().filter(|k| !k.hidden).count()
        );
    }

    #[test]
    fn bad_values_and_keys_are_errors_with_the_key() {
        assert!(matches!(
            resolve(&[layer(Origin::Image, &[("cores", "many")])]),
            Err(ConfigError::InvalidValue { .. })
        ));
        assert!(matches!(
            resolve(&[layer(Origin::ConfigPartition, &[("nope", "1")])]),
            Err(ConfigError::UnknownKey { .. })
        ));
        assert!(kernel_cmdline_pairs("ringstore.cores").is_err());
        assert_eq!(Origin::KernelCmdline.name(), "kernel-cmdline");
        assert!(Origin::Default < Origin::Image && Origin::ConfigPartition < Origin::KernelCmdline);
    }
}
