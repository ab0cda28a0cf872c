//! `crds/` must be exactly what `pullman crdgen` prints (docs/design.md §6).

#[test]
fn committed_crds_match_the_rust_types() {
    let committed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crds/pullman.dev.yaml"
    ))
    .unwrap();
    let generated = pullman::crd::crds_yaml();
    assert!(
        committed == generated,
        "crds/pullman.dev.yaml is stale: run `cargo run -- crdgen > crds/pullman.dev.yaml`"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pullman"))
        .arg("crdgen")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), generated);
}
