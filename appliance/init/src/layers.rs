//! Where PID 1's configuration comes from, lowest precedence first: built-in defaults, the
//! image's command line (baked into ringstore.efi; a copy in `/etc/ringstore/image-cmdline`),
//! the config partition's `/ringstore.toml`, and `ringstore.*` / `ip=` keys the running
//! kernel's command line has beyond the image's (typed at the boot manager, or `-append`).
//! Each layer is a list of (key, value). PID 1's own keys (`ip`, `ringstore.on_fatal`) are read
//! from the effective command line (the layers' tokens in order, so a later layer's key wins);
//! the server's keys go to `ringstore_config::origin::resolve` as [`ringstore_config::Layer`]s,
//! which records each value's origin for the console's `config`.

use ringstore_config::{ConfigError, Origin};

/// Where PID 1 finds the command line the image was built with.
pub const IMAGE_CMDLINE: &str = "/etc/ringstore/image-cmdline";

/// The layers, in precedence order, each with its (key, value) pairs: `ip`, `ringstore.KEY`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layers {
    pub layers: Vec<(Origin, Vec<(String, String)>)>,
}

/// A config partition value that cannot go on a command line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayerError {
    #[error("config partition: {0}")]
    Config(#[from] ConfigError),
    #[error("config partition: {key}: a value with spaces or quotes ({value:?}) is not allowed")]
    Spaces { key: String, value: String },
}

/// The configuration tokens of a command line: `ip=...` and `ringstore.KEY=VALUE`.
fn config_tokens(line: &str) -> impl Iterator<Item = &str> {
    line.split_whitespace()
        .filter(|t| t.starts_with("ip=") || t.starts_with("ringstore."))
}

fn pair(token: &str) -> (String, String) {
    let (k, v) = token.split_once('=').unwrap_or((token, ""));
    (k.to_string(), v.to_string())
}

impl Layers {
    /// Splits the running command line: tokens the image's line also has (as often) are the
    /// image's layer, the others the kernel command line's; `partition` is the config
    /// partition's TOML, if any.
    pub fn build(
        running: &str,
        image: &str,
        partition: Option<&str>,
    ) -> Result<Layers, LayerError> {
        let mut image_left: Vec<&str> = config_tokens(image).collect();
        let mut from_image = Vec::new();
        let mut from_kernel = Vec::new();
        for token in config_tokens(running) {
            if let Some(i) = image_left.iter().position(|t| *t == token) {
                image_left.remove(i);
                from_image.push(pair(token));
            } else {
                from_kernel.push(pair(token));
            }
        }
        let mut layers = vec![(Origin::Image, from_image)];
        if let Some(text) = partition {
            let mut pairs = Vec::new();
            for (key, value) in ringstore_config::toml_pairs(text)? {
                if value.is_empty() || value.contains(|c: char| c.is_whitespace() || c == '"') {
                    return Err(LayerError::Spaces { key, value });
                }
                let key = if key == "ip" {
                    key
                } else {
                    format!("ringstore.{key}")
                };
                pairs.push((key, value));
            }
            layers.push((Origin::ConfigPartition, pairs));
        }
        layers.push((Origin::KernelCmdline, from_kernel));
        Ok(Layers { layers })
    }

    /// The command line the parsers read: every other token of the running line first, then
    /// each layer's keys in precedence order.
    pub fn effective(&self, running: &str) -> String {
        let mut out: Vec<String> = running
            .split_whitespace()
            .filter(|t| !(t.starts_with("ip=") || t.starts_with("ringstore.")))
            .map(str::to_string)
            .collect();
        for (_, pairs) in &self.layers {
            out.extend(pairs.iter().map(|(k, v)| format!("{k}={v}")));
        }
        out.join(" ")
    }

    /// The server's keys, one [`ringstore_config::Layer`] per origin (PID 1's own keys left out).
    pub fn config_layers(&self) -> Vec<ringstore_config::Layer> {
        self.layers
            .iter()
            .map(|(origin, pairs)| ringstore_config::Layer {
                origin: *origin,
                pairs: pairs
                    .iter()
                    .filter_map(|(k, v)| {
                        Some((k.strip_prefix("ringstore.")?.to_string(), v.clone()))
                    })
                    .filter(|(k, _)| {
                        !crate::cmdline::INIT_KEYS.contains(&k.replace('-', "_").as_str())
                    })
                    .map(|(k, v)| (k, v.trim_matches('"').to_string()))
                    .collect(),
            })
            .collect()
    }

    /// Adds `pairs` (`ringstore.KEY`, value) to the config partition's layer ahead of its
    /// own keys, which win over them (a layer of its own when there is no ringstore.toml).
    pub fn under_partition(&mut self, pairs: Vec<(String, String)>) {
        if pairs.is_empty() {
            return;
        }
        match self
            .layers
            .iter_mut()
            .find(|(origin, _)| *origin == Origin::ConfigPartition)
        {
            Some((_, own)) => {
                let mut all = pairs;
                all.append(own);
                *own = all;
            }
            None => {
                let at = self
                    .layers
                    .iter()
                    .position(|(origin, _)| *origin == Origin::KernelCmdline)
                    .unwrap_or(self.layers.len());
                self.layers.insert(at, (Origin::ConfigPartition, pairs));
            }
        }
    }

    /// Whether a config partition layer is in.
    pub fn has_partition(&self) -> bool {
        self.layers
            .iter()
            .any(|(origin, _)| *origin == Origin::ConfigPartition)
    }

    /// The layers without the config partition's.
    pub fn without_partition(&self) -> Layers {
        Layers {
            layers: self
                .layers
                .iter()
                .filter(|(origin, _)| *origin != Origin::ConfigPartition)
                .cloned()
                .collect(),
        }
    }

    /// Why the config partition's layer is at fault, if it is: the layers do not parse (PID 1's
    /// keys) or resolve (the server's) with it, and do without it. A fault of the image or the
    /// kernel command line is not the partition's: it stays with the layers.
    pub fn partition_fault(&self, running: &str) -> Option<String> {
        if !self.has_partition() {
            return None;
        }
        let problem = |layers: &Layers| -> Option<String> {
            if let Err(err) = crate::cmdline::split(&layers.effective(running)) {
                return Some(err.to_string());
            }
            ringstore_config::origin::resolve(&layers.config_layers())
                .err()
                .map(|err| err.to_string())
        };
        let with = problem(self)?;
        problem(&self.without_partition()).is_none().then_some(with)
    }

    /// The origin of the value that wins for `key` (`ip`, `ringstore.memory`), if any layer sets it.
    pub fn origin_of(&self, key: &str) -> Option<Origin> {
        let norm = |k: &str| k.replace('-', "_");
        self.layers
            .iter()
            .rev()
            .find(|(_, pairs)| pairs.iter().any(|(k, _)| norm(k) == norm(key)))
            .map(|(o, _)| *o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IMAGE: &str = "console=ttyS0,115200 panic=-1 ringstore.data=auto ringstore.memory=64M";

    #[test]
    fn precedence_is_image_then_partition_then_kernel() {
        let running = format!("{IMAGE} ringstore.memory=256M");
        let toml = "memory = \"128M\"\nip = \"10.0.0.2::10.0.0.1:255.255.255.0::eth0:off\"\nmax_conns = 100\n";
        let layers = Layers::build(&running, IMAGE, Some(toml)).unwrap();
        assert_eq!(
            layers.origin_of("ringstore.memory"),
            Some(Origin::KernelCmdline)
        );
        assert_eq!(layers.origin_of("ip"), Some(Origin::ConfigPartition));
        assert_eq!(
            layers.origin_of("ringstore.max-conns"),
            Some(Origin::ConfigPartition)
        );
        assert_eq!(layers.origin_of("ringstore.data"), Some(Origin::Image));
        assert_eq!(layers.origin_of("ringstore.udp"), None);
        let line = layers.effective(&running);
        assert!(
            line.starts_with("console=ttyS0,115200 panic=-1 ringstore.data=auto"),
            "{line}"
        );
        let config = ringstore_config::Config::from_kernel_cmdline(&line).unwrap();
        assert_eq!(config.memory, 256 << 20, "the kernel command line wins");
        assert_eq!(config.max_conns, 100);
        let resolved = ringstore_config::origin::resolve(&layers.config_layers()).unwrap();
        assert_eq!(resolved.config, config);
        let memory = resolved
            .settings
            .iter()
            .find(|s| s.key == "memory")
            .unwrap();
        assert_eq!(
            (memory.value.as_str(), memory.origin),
            ("256M", Origin::KernelCmdline)
        );
        let (opts, _) = crate::cmdline::split(&line).unwrap();
        assert!(matches!(opts.ip, crate::cmdline::IpSetting::Static { .. }));
        // Without the kernel's extra key the partition's value wins over the image's.
        let layers = Layers::build(IMAGE, IMAGE, Some(toml)).unwrap();
        let config =
            ringstore_config::Config::from_kernel_cmdline(&layers.effective(IMAGE)).unwrap();
        assert_eq!(config.memory, 128 << 20);
    }

    #[test]
    fn keys_under_the_partition_lose_to_its_own_and_to_the_kernels() {
        let pairs = |v: &str| vec![("ringstore.tls_cert".to_string(), v.to_string())];
        let mut layers =
            Layers::build("ringstore.tls_cert=/k", "", Some("tls_cert = \"/own\"\n")).unwrap();
        layers.under_partition(pairs("/run"));
        let resolved = ringstore_config::origin::resolve(&layers.config_layers()).unwrap();
        assert_eq!(
            resolved.config.tls.cert.as_deref(),
            Some(std::path::Path::new("/k"))
        );
        let mut layers = Layers::build("", "", Some("tls_cert = \"/own\"\n")).unwrap();
        layers.under_partition(pairs("/run"));
        let resolved = ringstore_config::origin::resolve(&layers.config_layers()).unwrap();
        assert_eq!(
            resolved.config.tls.cert.as_deref(),
            Some(std::path::Path::new("/own"))
        );
        let mut layers = Layers::build("", "", None).unwrap();
        layers.under_partition(pairs("/run"));
        assert!(layers.has_partition());
        let resolved = ringstore_config::origin::resolve(&layers.config_layers()).unwrap();
        assert_eq!(
            resolved.config.tls.cert.as_deref(),
            Some(std::path::Path::new("/run"))
        );
        assert_eq!(layers.layers.last().unwrap().0, Origin::KernelCmdline);
    }

    #[test]
    fn without_an_image_line_every_key_is_the_kernels() {
        let layers = Layers::build(
            "ringstore.memory=64M ip=off ringstore.on_fatal=halt",
            "",
            None,
        )
        .unwrap();
        assert_eq!(layers.origin_of("ip"), Some(Origin::KernelCmdline));
        assert_eq!(layers.layers.len(), 2);
        let config = layers.config_layers();
        assert_eq!(config[1].pairs, [("memory".to_string(), "64M".to_string())]);
    }

    #[test]
    fn bad_partition_files_are_refused_with_the_reason() {
        let err = Layers::build(IMAGE, IMAGE, Some("memory = [1")).unwrap_err();
        assert!(err.to_string().starts_with("config partition:"), "{err}");
        let err = Layers::build(IMAGE, IMAGE, Some("memory = \"64 M\"")).unwrap_err();
        assert!(matches!(err, LayerError::Spaces { .. }), "{err}");
        let err = Layers::build(IMAGE, IMAGE, Some("memory = \"a\\\"b\"")).unwrap_err();
        assert!(matches!(err, LayerError::Spaces { .. }), "{err}");
        // Unknown keys are caught when the effective line is parsed, naming the key.
        let layers = Layers::build(IMAGE, IMAGE, Some("colour = \"red\"")).unwrap();
        let err =
            ringstore_config::Config::from_kernel_cmdline(&layers.effective(IMAGE)).unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }

    #[test]
    fn a_partition_fault_is_the_partitions_alone() {
        for bad in ["colour = \"red\"", "memory = \"lots\"", "ip = \"nonsense\""] {
            let layers = Layers::build(IMAGE, IMAGE, Some(bad)).unwrap();
            let fault = layers.partition_fault(IMAGE);
            assert!(fault.is_some(), "{bad}: no fault");
            let without = layers.without_partition();
            assert!(!without.has_partition() && without.partition_fault(IMAGE).is_none());
            assert_eq!(without.layers.len(), 2);
        }
        let layers = Layers::build(IMAGE, IMAGE, Some("colour = \"red\"")).unwrap();
        assert!(
            layers.partition_fault(IMAGE).unwrap().contains("colour"),
            "the error names the key"
        );
        let good = Layers::build(IMAGE, IMAGE, Some("max_conns = 10\n")).unwrap();
        assert_eq!(good.partition_fault(IMAGE), None);
        // A bad key on the kernel command line is not the partition's fault.
        let running = format!("{IMAGE} ringstore.colour=red");
        let layers = Layers::build(&running, IMAGE, Some("max_conns = 10\n")).unwrap();
        assert_eq!(layers.partition_fault(&running), None);
    }
}
