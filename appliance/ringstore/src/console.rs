//! `ringstore console --socket PATH | --tty DEV [--key FILE] [--timeout SECS] COMMAND...`: logs in
//! on an appliance's serial console (the challenge signed with the key file, or by the ssh-agent
//! at `SSH_AUTH_SOCK`), runs one command with `--json` and prints its JSON answer objects, one per
//! line. Exit status 0 when every object says `"ok":true`, 1 otherwise, 2 for usage errors.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use ringstore_console::client::{Client, Signer, StreamLink};

pub const USAGE: &str = "usage: ringstore console (--socket PATH | --tty DEV) [--key FILE] [--timeout SECS] COMMAND...\n\
  logs in (key file, else the ssh-agent at SSH_AUTH_SOCK), runs COMMAND --json, prints its JSON\n\
  (a tty must be set up first: stty -F DEV raw -echo 115200)\n";

struct Args {
    socket: Option<PathBuf>,
    tty: Option<PathBuf>,
    key: Option<PathBuf>,
    timeout: Duration,
    command: Vec<String>,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut out = Args {
        socket: None,
        tty: None,
        key: None,
        timeout: Duration::from_secs(30),
        command: Vec::new(),
    };
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let mut value = |name: &str| iter.next().cloned().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--socket" => out.socket = Some(value("--socket")?.into()),
            "--tty" => out.tty = Some(value("--tty")?.into()),
            "--key" => out.key = Some(value("--key")?.into()),
            "--timeout" => {
                let secs: u64 = value("--timeout")?
                    .parse()
                    .map_err(|_| "--timeout takes whole seconds".to_string())?;
                out.timeout = Duration::from_secs(secs.clamp(1, 3600));
            }
            _ => {
                out.command.push(arg.clone());
                out.command.extend(iter.by_ref().cloned());
            }
        }
    }
    if out.socket.is_some() == out.tty.is_some() {
        return Err("give exactly one of --socket PATH and --tty DEV".into());
    }
    if out.command.is_empty() {
        return Err("no COMMAND".into());
    }
    Ok(out)
}

pub fn run(args: &[String]) -> ExitCode {
    let args = match parse(args) {
        Ok(a) => a,
        Err(why) => {
            eprint!("ringstore console: {why}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run_parsed(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(why) => {
            eprintln!("ringstore console: {why}");
            ExitCode::from(1)
        }
    }
}

fn run_parsed(args: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    let signer = match (&args.key, std::env::var_os("SSH_AUTH_SOCK")) {
        (Some(key), _) => Signer::from_key_file(key)?,
        (None, Some(sock)) => Signer::Agent {
            socket: sock.into(),
            key: None,
        },
        (None, None) => return Err("no --key FILE and no SSH_AUTH_SOCK".into()),
    };
    let command = args.command.join(" ");
    let answer = if let Some(path) = &args.socket {
        let stream = std::os::unix::net::UnixStream::connect(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        session(
            StreamLink::new(stream.try_clone()?, stream),
            args,
            &signer,
            &command,
        )?
    } else {
        let path = args.tty.as_ref().ok_or("no --tty")?;
        let open = |write| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(write)
                .open(path)
                .map_err(|e| format!("{}: {e}", path.display()))
        };
        session(
            StreamLink::new(open(false)?, open(true)?),
            args,
            &signer,
            &command,
        )?
    };
    let mut all_ok = true;
    for object in &answer {
        all_ok &= object["ok"] == true;
        println!("{object}");
    }
    Ok(all_ok)
}

fn session<W: std::io::Write>(
    link: StreamLink<W>,
    args: &Args,
    signer: &Signer,
    command: &str,
) -> Result<Vec<serde_json::Value>, Box<dyn std::error::Error>> {
    let mut client = Client::new(link);
    client.limit = args.timeout;
    client.sync()?;
    client.login(signer)?;
    let answer = client.run(command)?;
    if !matches!(
        args.command[0].as_str(),
        "logout" | "exit" | "poweroff" | "reboot" | "halt" | "shutdown"
    ) {
        // Leave no session open behind us on a shared line.
        let _ = client.run("logout");
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    /// A box on the other end of a socket pair: PID 1's real console code (login, table,
    /// framing) answering each line, the prompt after each answer, and a kernel record thrown
    /// into the middle of its output.
    #[cfg(feature = "pid1")]
    fn fake_box(mut stream: std::os::unix::net::UnixStream) {
        use ringstore_init::console::{handle_line, session::Session, PROMPT};
        use std::io::{BufRead, Write};
        let public = include_str!("../../../tests/keys/test_ed25519.pub");
        ringstore_init::console::session::add_authorized_key_lines("test", &[public.trim()])
            .unwrap();
        let mut session = Session::new("fake", "boot");
        let machine = ringstore_init::machine::Machine::default();
        let reader = std::io::BufReader::new(stream.try_clone().unwrap());
        stream.write_all(PROMPT.as_bytes()).unwrap();
        for line in reader.lines() {
            let Ok(line) = line else { break };
            let answer = handle_line(&mut session, &machine, &line, std::time::Instant::now());
            let mut text = String::new();
            for l in answer {
                text.push_str(&l);
                text.push_str("\r\n");
            }
            // The kernel writes its records between any two bytes.
            let mid = text.len() / 2;
            if text.is_char_boundary(mid) {
                text.insert_str(mid, "[    9.123456] virtio_net virtio0 eth0: link up\n");
            }
            if let Some(prompt) = session.prompt() {
                text.push_str(prompt);
            }
            if stream.write_all(text.as_bytes()).is_err() {
                break;
            }
        }
    }

    #[cfg(feature = "pid1")]
    #[test]
    fn the_client_logs_in_and_runs_one_command_against_pid1s_console() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        std::thread::spawn(move || fake_box(theirs));
        let key =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/keys/test_ed25519");
        let args = parse(&strings(&[
            "--socket",
            "-",
            "--key",
            key.to_str().unwrap(),
            "help",
        ]))
        .unwrap();
        let signer = Signer::from_key_file(&key).unwrap();
        let link = StreamLink::new(ours.try_clone().unwrap(), ours);
        let answer = session(link, &args, &signer, "help").unwrap();
        assert_eq!(answer.len(), 1);
        assert_eq!(
            (answer[0]["v"].as_u64(), answer[0]["cmd"].as_str()),
            (Some(1), Some("help"))
        );
        assert!(answer[0]["commands"].as_array().unwrap().len() > 10);
        // The wrong key is refused.
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        std::thread::spawn(move || fake_box(theirs));
        let wrong = Signer::from_key_file(&key.with_file_name("wrong_ed25519")).unwrap();
        let link = StreamLink::new(ours.try_clone().unwrap(), ours);
        let err = session(link, &args, &wrong, "help")
            .unwrap_err()
            .to_string();
        assert!(err.contains("login refused"), "{err}");
    }

    #[test]
    fn arguments() {
        let a = parse(&strings(&[
            "--socket", "/s", "--key", "k", "flush", "--yes",
        ]))
        .unwrap();
        assert_eq!(a.command, ["flush", "--yes"]);
        assert_eq!(a.socket.as_deref(), Some(std::path::Path::new("/s")));
        assert!(parse(&strings(&["status"])).is_err(), "no transport");
        assert!(parse(&strings(&["--socket", "/s", "--tty", "/t", "status"])).is_err());
        assert!(parse(&strings(&["--socket", "/s"])).is_err(), "no command");
        assert!(parse(&strings(&["--socket", "/s", "--timeout", "x", "status"])).is_err());
    }
}
