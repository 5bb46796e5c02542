//! The `podman run` commands of the container guide (docs/CONTAINER.md) and the README, run as
//! the pages print them: read from the pages, so they cannot drift from what was tested.
//!
//! Only what cannot be run verbatim on a shared test host is changed: each published port
//! goes to a free loopback port, the named volume to a fresh one of this run's own (a user's
//! `rs-data` is never touched), and the container gets a name and the options this machine
//! needs to run one at all. Image, seccomp profile and every flag after the image are the
//! page's.

use anyhow::{bail, Context, Result};

use super::podman::{self, Container};

/// The page whose commands are run, and the README, whose one command is the page's first.
const PAGE: &str = "docs/CONTAINER.md";
const PAGES: [&str; 2] = ["README.md", PAGE];

/// Every `podman run` command in `text`'s `sh` blocks, split into words (the page's commands
/// quote nothing).
pub fn commands(text: &str) -> Vec<Vec<String>> {
    let words = ringstore_testkit::docs::sh_commands(text)
        .into_iter()
        .map(|c| c.split_whitespace().map(String::from).collect::<Vec<_>>());
    words
        .filter(|w| w.starts_with(&["podman".to_string(), "run".to_string()]))
        .collect()
}

/// One command made runnable here: `--name` and the machine's options after `run`, each
/// `-p HOST:PORT` to `127.0.0.1:FREE:PORT`, each `-v VOLUME:/DIR` to `volume`. Returns the
/// arguments after `podman` and the free ports chosen for container ports 11211 and 8080.
pub fn localize(
    words: &[String],
    name: &str,
    machine: &[String],
    volume: &str,
) -> Result<(Vec<String>, u16, u16)> {
    let mut args = vec!["run".to_string(), "--name".into(), name.into()];
    args.extend(machine.iter().cloned());
    let (mut mc, mut http) = (None, None);
    let mut it = words.iter().skip(2);
    while let Some(word) = it.next() {
        args.push(word.clone());
        let Some(value) = (word == "-p" || word == "-v").then(|| it.next()).flatten() else {
            continue;
        };
        let inner = value.rsplit(':').next().unwrap_or_default().to_string();
        if word == "-v" {
            args.push(format!("{volume}:{inner}"));
            continue;
        }
        let port = podman::free_port()?;
        match inner.as_str() {
            "11211" => mc = Some(port),
            "8080" => http = Some(port),
            other => bail!("{PAGES:?}: a published port this check does not know: {other}"),
        }
        args.push(format!("127.0.0.1:{port}:{inner}"));
    }
    match (mc, http) {
        (Some(mc), Some(http)) => Ok((args, mc, http)),
        _ => bail!(
            "{PAGES:?}: `{}` does not publish 11211 and 8080",
            words.join(" ")
        ),
    }
}

/// Runs every `podman run` command of the page: each must serve memcache and HTTP through
/// its ports, with io_uring where it names the io_uring profile and epoll where it does not;
/// one with `--data` must still hold its value after `podman restart`.
pub fn run_all(machine: &[String]) -> Result<()> {
    let all = page_commands()?;
    if all.len() < 2 {
        bail!(
            "{PAGES:?}: expected their podman run commands, found {}",
            all.len()
        );
    }
    for (i, words) in all.iter().enumerate() {
        let shown = words.join(" ");
        run_one(words, i, machine).with_context(|| format!("{PAGES:?}: `{shown}`"))?;
        eprintln!(
            "oci: podman run command {} of {PAGES:?} served as printed: ok",
            i + 1
        );
    }
    Ok(())
}

/// The `podman run` commands of [`PAGES`], each once, in the order they first appear.
fn page_commands() -> Result<Vec<Vec<String>>> {
    let mut all: Vec<Vec<String>> = Vec::new();
    for page in PAGES {
        let text = std::fs::read_to_string(crate::util::root().join(page))
            .with_context(|| format!("reading {page}"))?;
        for words in commands(&text) {
            if !all.contains(&words) {
                all.push(words);
            }
        }
    }
    Ok(all)
}

fn run_one(words: &[String], i: usize, machine: &[String]) -> Result<()> {
    let name = format!("ringstore-oci-recipe-{i}-{}", std::process::id());
    let volume = format!("{name}-data");
    let (args, mc, http) = localize(words, &name, machine, &volume)?;
    let _ = podman::podman(&["rm", "-f", &name]);
    let _ = podman::podman(&["volume", "rm", "-f", &volume]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let c = Container::named(&name);
    let result = podman::podman(&args).and_then(|_| served(&c, words, mc, http));
    drop(c);
    let _ = podman::podman(&["volume", "rm", "-f", &volume]);
    result
}

/// What the container did with the page's command, checked through its ports and its log.
fn served(c: &Container, words: &[String], mc: u16, http: u16) -> Result<()> {
    podman::wait_ready(c, mc)?;
    podman::exercise(mc, http).with_context(|| format!("container log:\n{}", c.logs()))?;
    let uring = words
        .iter()
        .any(|w| w.contains(super::SECCOMP_PROFILE_NAME));
    let log = c.logs();
    if uring == log.contains("serving with epoll") {
        bail!("io_uring profile named: {uring}, but the log says otherwise:\n{log}");
    }
    if words.iter().any(|w| w == "--data") {
        podman::podman(&["restart", "-t", "10", c.name()])?;
        podman::wait_ready(c, mc)?;
        let r = podman::exchange(mc, b"get oci:k\r\n", b"END\r\n")?;
        if r != b"VALUE oci:k 0 5\r\nhello\r\nEND\r\n" {
            bail!(
                "after a restart on its volume: {:?}",
                String::from_utf8_lossy(&r)
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_read_and_localized_as_printed() {
        let page = "text\n```sh\npodman load -i x.tar\npodman run -d -p 11211:11211 \\\n  \
                    -p 8080:8080 -v rs-data:/data img --memory 1GiB   # comment\n```\n\
                    ```\npodman run not-sh\n```\n";
        let all = commands(page);
        assert_eq!(all.len(), 1);
        assert_eq!(
            all[0].join(" "),
            "podman run -d -p 11211:11211 -p 8080:8080 -v rs-data:/data img --memory 1GiB"
        );
        let machine = ["--runtime".to_string(), "runc".to_string()];
        let (args, mc, http) = localize(&all[0], "n", &machine, "vol").unwrap();
        assert_eq!(
            args.join(" "),
            format!(
                "run --name n --runtime runc -d -p 127.0.0.1:{mc}:11211 -p \
                 127.0.0.1:{http}:8080 -v vol:/data img --memory 1GiB"
            )
        );
    }

    /// The pages have the commands the check runs: the default profile (the README's too),
    /// and the durable one under the committed io_uring profile on a fresh volume.
    #[test]
    fn the_container_pages_have_both_commands() {
        let readme = std::fs::read_to_string(crate::util::root().join("README.md")).unwrap();
        assert_eq!(
            commands(&readme).len(),
            1,
            "the README's podman run command"
        );
        let all: Vec<String> = page_commands()
            .unwrap()
            .iter()
            .map(|w| w.join(" "))
            .collect();
        assert_eq!(all.len(), 2, "{all:?}");
        assert!(all.iter().any(|c| !c.contains("seccomp=")), "{all:?}");
        let durable = format!("seccomp={}", super::super::SECCOMP_PROFILE);
        assert!(
            all.iter().any(|c| c.contains(&durable)
                && c.contains("-v rs-data:/data")
                && c.contains("--data /data/ringstore.data --data-size")),
            "{all:?}"
        );
    }
}
