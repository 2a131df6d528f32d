//! `forkyard keys`: API keys of the gateway, on its key file.

use crate::cli::{KeysArgs, KeysCommand};
use crate::output::{Output, outln, print_value};
use forkyard_keys::{KeyInfo, KeyStore};
use std::process::ExitCode;

fn row(k: &KeyInfo) -> String {
    let revoked = if k.revoked_unix_ms == 0 {
        "-".to_owned()
    } else {
        crate::when::iso(k.revoked_unix_ms)
    };
    format!(
        "{:<16}  {:<20}  {:<20}  {:<20}  {}",
        k.id,
        k.tenant,
        crate::when::iso(k.created_unix_ms),
        revoked,
        k.name
    )
}

pub async fn run(args: KeysArgs, output: Output) -> anyhow::Result<ExitCode> {
    let path = args
        .keys_db
        .unwrap_or_else(|| args.state_dir.join("gateway").join("api-keys.db"));
    let store = KeyStore::open(&path)
        .await
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    match args.command {
        KeysCommand::Create { tenant, name } => {
            let k = store.create(&tenant, &name).await?;
            let made = serde_json::json!({"id": k.info.id, "tenant": k.info.tenant, "name": k.info.name, "key": k.key});
            match output {
                Output::Json | Output::Yaml => print_value(&made, output)?,
                Output::Table => {
                    eprintln!(
                        "key {} for tenant {} (shown once; the gateway keeps only its digest):",
                        k.info.id, k.info.tenant
                    );
                    outln!("{}", k.key);
                }
            }
        }
        KeysCommand::List => {
            let keys = store.list().await?;
            match output {
                Output::Json | Output::Yaml => print_value(&keys, output)?,
                Output::Table => {
                    outln!(
                        "{:<16}  {:<20}  {:<20}  {:<20}  NAME",
                        "ID",
                        "TENANT",
                        "CREATED",
                        "REVOKED"
                    );
                    for k in &keys {
                        outln!("{}", row(k));
                    }
                }
            }
        }
        KeysCommand::Revoke { id } => {
            let k = store.revoke(&id).await?;
            match output {
                Output::Json | Output::Yaml => print_value(&k, output)?,
                Output::Table => outln!("revoked key {} of tenant {}", k.id, k.tenant),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
