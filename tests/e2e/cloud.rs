//! Datasets in S3: shard to a real S3-compatible server (moto's server mode on
//! 127.0.0.1, started and stopped here), then verify, inspect and load.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use parquet::basic::Compression;
use shardfeed_fixtures::{FileFormat, Kind, write_dataset};
use shardfeed_loader::Loader;

use crate::support::*;

/// A secret that must never be printed.
const SECRET: &str = "sEcReT-do-not-print-7f3a";

/// moto's S3 server on a free loopback port, with one bucket; stopped on drop.
struct Moto {
    child: Child,
    port: u16,
}

impl Moto {
    fn start() -> Moto {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server runs (pip install -r requirements-dev.txt)");
        let moto = Moto { child, port };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "moto_server did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let script = format!(
            "import boto3; boto3.client('s3', endpoint_url='http://127.0.0.1:{port}', aws_access_key_id='testing', \
             aws_secret_access_key='testing', region_name='us-east-1').create_bucket(Bucket='test-bucket')"
        );
        let status = python().arg("-c").arg(script).status().unwrap();
        assert!(status.success(), "could not create the bucket");
        moto
    }

    fn options(&self) -> Vec<(String, String)> {
        [
            ("aws_endpoint", format!("http://127.0.0.1:{}", self.port)),
            ("aws_allow_http", "true".to_string()),
            ("aws_access_key_id", "AKIDEXAMPLE".to_string()),
            ("aws_secret_access_key", SECRET.to_string()),
            ("aws_region", "us-east-1".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn cli_options(&self) -> Vec<String> {
        self.options()
            .into_iter()
            .flat_map(|(k, v)| ["--storage-option".to_string(), format!("{k}={v}")])
            .collect()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn assert_no_secret(what: &str, run: &Run) {
    assert!(
        !run.stdout.contains(SECRET) && !run.stderr.contains(SECRET),
        "{what} printed the secret"
    );
}

#[test]
fn shard_to_s3_then_verify_inspect_and_load_like_local() {
    let moto = Moto::start();
    let tmp = tempdir();
    let inputs: Vec<String> = write_dataset(
        &tmp.path().join("in"),
        Kind::Text,
        2500,
        3,
        5,
        FileFormat::Parquet(Compression::SNAPPY),
    )
    .unwrap()
    .iter()
    .map(|p| s(p))
    .collect();
    let shard_args = |output: &str, extra: &[String]| {
        let mut args: Vec<String> = vec!["shard".into()];
        args.extend(inputs.iter().cloned());
        args.extend(
            [
                "--output",
                output,
                "--row-group-rows",
                "200",
                "--shard-size",
                "16KiB",
            ]
            .map(String::from),
        );
        args.extend(extra.iter().cloned());
        args
    };
    let local = tmp.path().join("ds");
    shardfeed(&shard_args(&s(&local), &[])).success();
    let url = "s3://test-bucket/datasets/text";
    let opts = moto.cli_options();
    let run = shardfeed(&shard_args(url, &opts)).success();
    assert_no_secret("shard", &run);

    // The same dataset, byte for byte: the manifests are identical.
    let verify = shardfeed(
        &[
            vec!["verify".to_string(), url.into(), "--json".into()],
            opts.clone(),
        ]
        .concat(),
    )
    .success();
    assert_no_secret("verify", &verify);
    assert_eq!(verify.json()["rows"], 2500);
    let inspect = shardfeed(
        &[
            vec!["inspect".to_string(), url.into(), "--json".into()],
            opts.clone(),
        ]
        .concat(),
    )
    .success();
    assert_eq!(inspect.json()["shards"], manifest(&local).shards.len());

    // Loading from S3 gives the local run's batches, row for row.
    let load = |url: &str, remote: bool| -> Vec<Vec<i64>> {
        let mut builder = Loader::builder(url)
            .batch_size(64)
            .seed(8)
            .window(2)
            .drop_last(false);
        if remote {
            for (k, v) in moto.options() {
                builder = builder.storage_option(k, v);
            }
        }
        builder
            .build()
            .unwrap()
            .map(|b| b.unwrap().values::<i64>("id").unwrap().to_vec())
            .collect()
    };
    let expected = load(&s(&local), false);
    assert_eq!(load(url, true), expected);

    // An existing dataset is refused without --overwrite, and errors never show the secret.
    let again = shardfeed(&shard_args(url, &opts)).failure();
    assert!(
        again.stderr.contains(url) && again.stderr.contains("--overwrite"),
        "{}",
        again.stderr
    );
    assert_no_secret("shard again", &again);
    let missing = shardfeed(
        &[
            vec!["verify".to_string(), "s3://test-bucket/nope".into()],
            opts.clone(),
        ]
        .concat(),
    )
    .failure();
    assert!(
        missing
            .stderr
            .contains("s3://test-bucket/nope/manifest.json"),
        "{}",
        missing.stderr
    );
    assert_no_secret("verify missing", &missing);
    let err = Loader::builder("s3://test-bucket/nope")
        .storage_option("aws_endpoint", format!("http://127.0.0.1:{}", moto.port))
        .storage_option("aws_allow_http", "true")
        .storage_option("aws_access_key_id", "AKIDEXAMPLE")
        .storage_option("aws_secret_access_key", SECRET)
        .storage_option("aws_region", "us-east-1")
        .build()
        .unwrap_err();
    assert!(
        !format!("{err} {err:?}").contains(SECRET),
        "the error shows the secret"
    );
}
