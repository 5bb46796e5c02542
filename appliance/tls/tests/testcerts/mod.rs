//! Throwaway test certificates made with the `openssl` CLI at test time (nothing committed):
//! a CA, a server certificate for localhost/127.0.0.1, a client certificate from that CA,
//! and one from another CA. (Expired certificates are made by the e2e tests, with Python's
//! `cryptography`: openssl 3.0's CLI cannot back-date one without a CA database.)

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct TestCerts {
    pub dir: tempfile::TempDir,
}

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(status.success(), "openssl {args:?}");
}

fn ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

fn leaf(dir: &Path, name: &str, ca: &str, ext: &str) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    std::fs::write(dir.join(format!("{name}.ext")), ext).expect("ext file");
    let mut args = vec!["x509", "-req", "-in", &*format!("{name}.csr")]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    let rest = [
        "-CA",
        &format!("{ca}.pem"),
        "-CAkey",
        &format!("{ca}.key"),
        "-CAcreateserial",
        "-out",
        &format!("{name}.pem"),
        "-extfile",
        &format!("{name}.ext"),
    ]
    .map(|s| s.to_string());
    args.extend(rest);
    args.extend(["-days", "2"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    openssl(dir, &args);
}

impl TestCerts {
    pub fn make() -> TestCerts {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        ca(d, "ca");
        ca(d, "otherca");
        leaf(
            d,
            "server",
            "ca",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        leaf(
            d,
            "server2",
            "ca",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        leaf(d, "client", "ca", "extendedKeyUsage=clientAuth\n");
        leaf(d, "stranger", "otherca", "extendedKeyUsage=clientAuth\n");
        TestCerts { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}
