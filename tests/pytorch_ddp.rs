//! The pytorch-ddp example's own training script, with Debian's PyTorch,
//! gang-started by real `zkgate barrier run` participants on a real
//! ZooKeeper: both ranks train to the same weights (DDP averaged their
//! gradients), and neither's script starts before the other participant
//! was launched. Each rank gets the environment `torchrun` gives its one
//! worker: Debian's `torchrun` 1.13 fails at start on Python 3.11 (see
//! `examples/pytorch-ddp/README.md`).

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use support::{children, eventually, isolated_connect, session, zkgate};

const BARRIERS: &str = "/zkgate/namespaces/default/barriers";

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// The example's ConfigMap's `train.py`, and the Job's `torchrun` flags.
fn example() -> (String, Vec<String>) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/pytorch-ddp");
    let configmap: serde_json::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("configmap.yaml")).unwrap())
            .unwrap();
    let script = configmap["data"]["train.py"].as_str().unwrap().to_owned();
    let job: serde_json::Value = serde_yaml_ng::Deserializer::from_str(
        &std::fs::read_to_string(dir.join("job.yaml")).unwrap(),
    )
    .map(|d| serde_json::Value::deserialize(d).unwrap())
    .next()
    .unwrap();
    let command: Vec<String> =
        serde_json::from_value(job["spec"]["template"]["spec"]["containers"][0]["command"].clone())
            .unwrap();
    (script, command)
}

#[tokio::test]
async fn the_ddp_examples_ranks_gang_start_and_train_to_the_same_weights() {
    let (script, command) = example();
    // The flags torchrun is given, as the environment it gives its worker.
    assert_eq!(command[0], "torchrun");
    let flag = |name: &str| {
        command
            .iter()
            .find_map(|c| c.strip_prefix(&format!("--{name}=")))
            .unwrap_or_else(|| panic!("the Job's torchrun has no --{name}"))
            .to_owned()
    };
    assert_eq!(flag("nproc_per_node"), "1");
    assert_eq!(flag("node_rank"), "$(JOB_COMPLETION_INDEX)");
    let world = flag("nnodes");
    assert_eq!(world, "2");
    let port = support::zookeeper::free_port().to_string();
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.py");
    std::fs::write(&train, script).unwrap();

    let connect = isolated_connect();
    let observer = session(&connect).await;
    let rank = |index: usize| {
        let mut cmd = zkgate(
            &connect,
            &[
                "barrier",
                "run",
                "ddp-train",
                "--participants",
                &world,
                "--id",
                &format!("ddp-train-{index}"),
                "--timeout",
                "120s",
                "--",
                "/usr/bin/python3",
                train.to_str().unwrap(),
            ],
        );
        cmd.env("RANK", index.to_string())
            .env("LOCAL_RANK", "0")
            .env("WORLD_SIZE", &world)
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", &port)
            .env("STEPS", "50")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        cmd.spawn().expect("zkgate barrier run")
    };
    let first = rank(0);
    // Rank 0 waits at the barrier (registered) before rank 1 is launched.
    eventually(Duration::from_secs(20), "rank 0's registration", || async {
        (children(&observer, &format!("{BARRIERS}/ddp-train"))
            .await
            .len()
            == 1)
            .then_some(())
    })
    .await;
    // A gap that a gate letting rank 0 through alone could not hide: its
    // script would start (and print its start) before rank 1 exists.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second_launched = now_us();
    let second = rank(1);
    let mut checksums = vec![];
    for (index, child) in [first, second].into_iter().enumerate() {
        let out = tokio::time::timeout(Duration::from_secs(180), child.wait_with_output())
            .await
            .expect("rank trained within 3 minutes")
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "rank {index}: {stdout}\n{stderr}");
        let started: u128 = stdout
            .lines()
            .find_map(|l| l.split_once("started-at-us ")?.1.trim().parse().ok())
            .unwrap_or_else(|| panic!("rank {index} printed no start: {stdout}"));
        assert!(
            started >= second_launched,
            "rank {index}'s script started {} us before rank 1 was launched",
            second_launched - started
        );
        let trained = stdout
            .lines()
            .find(|l| l.starts_with(&format!("rank {index} of 2 trained")))
            .unwrap_or_else(|| panic!("rank {index} did not train: {stdout}"));
        checksums.push(
            trained
                .rsplit_once("weights-checksum ")
                .unwrap()
                .1
                .to_owned(),
        );
    }
    assert_eq!(
        checksums[0], checksums[1],
        "DDP keeps the ranks' weights the same"
    );
}
