//! Warm copies seen from outside: a floor of them, and what `/metrics` says of how each
//! workspace was made. A binary of its own: the metrics are process-wide, which every
//! test of a binary shares under plain `cargo test`.

mod common;

/// A value of the process's `/metrics` (0 when it has none yet).
fn metric(name: &str, label: Option<(&str, &str)>) -> f64 {
    forkyard_common::metrics::registry()
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter())
        .filter(|m| {
            label.is_none_or(|(k, v)| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == k && l.value() == v)
            })
        })
        // A family is a counter or a gauge; the other reads 0.
        .map(|m| m.get_counter().get_value() + m.get_gauge().get_value())
        .sum()
}

/// An operator's floor of warm copies (`--warm-copies-min`): after one create of a
/// repository, as many copies as the floor are made ahead (demand alone would make
/// one), so a larger wave next takes them. `/metrics` says how each workspace was made
/// and how many copies are ready.
#[tokio::test]
async fn a_floor_of_warm_copies_readies_a_larger_wave_and_metrics_show_how_creates_went() {
    let f = common::fixture_with(|_, c| {
        c.warm = forkyard_sandbox_provisioner::local::WarmBounds {
            copies: 8,
            bytes: 1 << 30,
            min: 4,
        };
    })
    .await;
    let made = |how| metric("sandbox_workspace_made_total", Some(("source", how)));
    f.create().await;
    // Made from the template at the create: an overlay of it where the kernel allows.
    assert_eq!(made("template_copy") + made("overlay"), 1.0);
    assert_eq!(made("warm_copy") + made("warm_overlay"), 0.0);
    let ready = common::eventually(std::time::Duration::from_secs(20), || {
        metric("sandbox_warm_copies", None) == 4.0
    })
    .await;
    assert!(
        ready,
        "copies ready: {}",
        metric("sandbox_warm_copies", None)
    );
    // Made ahead for the floor, not past it.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(metric("sandbox_warm_copies", None), 4.0);

    let wave = futures::future::join_all(
        (0..4).map(|n| f.core.create(f.request(&format!("forkyard-fork-w{n}")))),
    )
    .await;
    assert!(wave.iter().all(Result::is_ok), "{wave:?}");
    // Copies, or overlays made ahead where the workspaces are overlays.
    assert_eq!(made("warm_copy") + made("warm_overlay"), 4.0);
    assert_eq!(made("template_copy") + made("overlay"), 1.0);
}
