//! `forkyard keys`: the gateway's API keys, through its admin API (`ApiKeys`, with an
//! admin tenant's key), or on the key store itself (`--local`, `--keys-db`,
//! `--keys-url`, or no key configured): how the first admin key is made on the host.

use crate::cli::{KeysArgs, KeysCommand};
use crate::client::{Bearer, status_error};
use crate::output::{Output, outln, print_value};
use forkyard_keys::{KeyInfo, KeyStore};
use forkyard_proto::gateway::v1::{
    ApiKey, CreateApiKeyRequest, ListApiKeysRequest, RevokeApiKeyRequest,
    api_keys_client::ApiKeysClient,
};
use std::process::ExitCode;
use tonic::{service::interceptor::InterceptedService, transport::Channel};

pub type Client = ApiKeysClient<InterceptedService<Channel, Bearer>>;

/// The admin API's client on `channel`, calling with `key`.
pub fn api_client(channel: Channel, key: &str) -> anyhow::Result<Client> {
    Ok(ApiKeysClient::with_interceptor(
        channel,
        Bearer::new(Some(key))?,
    ))
}

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

fn info(k: ApiKey) -> KeyInfo {
    KeyInfo {
        id: k.id,
        tenant: k.tenant,
        name: k.name,
        created_unix_ms: k.created_unix_ms,
        revoked_unix_ms: k.revoked_unix_ms,
    }
}

/// What one command did, printed the same whichever way it was done.
enum Done {
    Made(KeyInfo, String),
    Listed(Vec<KeyInfo>),
    Revoked(KeyInfo),
}

/// On the store itself.
pub async fn run(args: KeysArgs, output: Output) -> anyhow::Result<ExitCode> {
    let store = match &args.keys_url {
        Some(url) => KeyStore::connect(url)
            .await
            .map_err(|e| anyhow::anyhow!("--keys-url (FORKYARD_API_KEYS_URL): {e}"))?,
        None => {
            let path = args
                .keys_db
                .unwrap_or_else(|| args.state_dir.join("gateway").join("api-keys.db"));
            KeyStore::open(&path)
                .await
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
    };
    let done = match args.command {
        KeysCommand::Create { tenant, name } => {
            let k = store.create(&tenant, &name).await?;
            Done::Made(k.info, k.key)
        }
        KeysCommand::List => Done::Listed(store.list().await?),
        KeysCommand::Revoke { id } => Done::Revoked(store.revoke(&id).await?),
    };
    print(done, output)
}

/// Through the gateway's admin API.
pub async fn remote(
    mut client: Client,
    command: KeysCommand,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let done = match command {
        KeysCommand::Create { tenant, name } => {
            let made = client
                .create_api_key(CreateApiKeyRequest { tenant, name })
                .await
                .map_err(status_error)?
                .into_inner();
            let key = made
                .key
                .map(info)
                .unwrap_or_else(|| info(ApiKey::default()));
            Done::Made(key, made.secret)
        }
        KeysCommand::List => {
            let listed = client.list_api_keys(ListApiKeysRequest {}).await;
            let keys = listed.map_err(status_error)?.into_inner().keys;
            Done::Listed(keys.into_iter().map(info).collect())
        }
        KeysCommand::Revoke { id } => {
            let revoked = client.revoke_api_key(RevokeApiKeyRequest { id }).await;
            let key = revoked.map_err(status_error)?.into_inner().key;
            Done::Revoked(info(key.unwrap_or_default()))
        }
    };
    print(done, output)
}

fn print(done: Done, output: Output) -> anyhow::Result<ExitCode> {
    let structured = matches!(output, Output::Json | Output::Yaml);
    match done {
        Done::Made(k, key) if structured => {
            let made =
                serde_json::json!({"id": k.id, "tenant": k.tenant, "name": k.name, "key": key});
            print_value(&made, output)?;
        }
        Done::Made(k, key) => {
            eprintln!(
                "key {} for tenant {} (shown once; the gateway keeps only its digest):",
                k.id, k.tenant
            );
            outln!("{key}");
        }
        Done::Listed(keys) if structured => print_value(&keys, output)?,
        Done::Listed(keys) => {
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
        Done::Revoked(k) if structured => print_value(&k, output)?,
        Done::Revoked(k) => outln!("revoked key {} of tenant {}", k.id, k.tenant),
    }
    Ok(ExitCode::SUCCESS)
}
