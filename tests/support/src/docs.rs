//! Reading the commands the pages print, so tests run them as written: the `sh` blocks of a
//! markdown page and the `cargo xtask` flags a page names.

use std::collections::BTreeSet;

/// The commands of `markdown`'s `sh` code blocks, in order: continuation lines (`\`) joined,
/// comment lines and trailing ` # comments` dropped, each trimmed.
pub fn sh_commands(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in markdown.lines() {
        if line.starts_with("```") {
            in_sh = line == "```sh";
            continue;
        }
        if !in_sh || line.trim_start().starts_with('#') {
            continue;
        }
        let code = line.split(" #").next().unwrap_or_default().trim_end();
        match code.strip_suffix('\\') {
            Some(head) => pending.push_str(head),
            None => {
                pending.push_str(code);
                let command = std::mem::take(&mut pending);
                if !command.trim().is_empty() {
                    out.push(command.trim().to_string());
                }
            }
        }
    }
    out
}

/// Every `--flag` that `text` names on a line about `cargo xtask CMD`, as (CMD, flag).
pub fn documented_flags(text: &str) -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let Some(at) = line.find("cargo xtask ") else {
            continue;
        };
        let rest = &line[at + "cargo xtask ".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        for word in rest.split(|c: char| c.is_whitespace() || "[]`()|,".contains(c)) {
            if word.starts_with("--") && word.len() > 2 {
                found.insert((name.clone(), word.trim_end_matches('.').to_string()));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sh_blocks_are_read_as_commands() {
        let page = "text\n```sh\n# a comment\npodman run -d \\\n  -p 1:2 img  # trailing\n\n\
                    echo '^#' x\n```\n```toml\nnot = 1\n```\n```sh\nls\n```\n";
        assert_eq!(
            sh_commands(page),
            ["podman run -d   -p 1:2 img", "echo '^#' x", "ls"]
        );
    }

    #[test]
    fn flags_are_found_by_command() {
        let page = "`cargo xtask image [--out DIR]`\n`cargo xtask bench --only x`.\n\
                    --loose flag on a line without the command\n";
        let found: Vec<(String, String)> = documented_flags(page).into_iter().collect();
        assert_eq!(
            found,
            [
                ("bench".to_string(), "--only".to_string()),
                ("image".to_string(), "--out".to_string())
            ]
        );
    }
}
