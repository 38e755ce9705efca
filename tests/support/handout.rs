//! The controller's credential handout, as the tests reach it: a
//! controller serving it on a loopback port (with the webhook it rides
//! on), and ServiceAccount tokens made by the API server's TokenRequest,
//! which is what the kubelet projects into a pod.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{Api, PostParams};
use zkgate::handout::{Handout, Source};
use zkgate::zk::Credential;

use super::eventually;
use super::zookeeper::free_port;

/// The ServiceAccount whose tokens the tests' participants carry.
pub const SERVICE_ACCOUNT: &str = "participant";

/// Where a test controller serves the handout.
pub struct Served {
    /// Its port on 127.0.0.1 (the webhook's).
    pub port: u16,
    /// The namespace of its webhook certificate Secret.
    pub secret_namespace: String,
    /// That Secret's name.
    pub secret: String,
}

impl Served {
    /// A handout on a free port, its certificate kept in a Secret of
    /// `secret_namespace`.
    pub fn new(secret_namespace: &str) -> Served {
        let port = free_port();
        Served {
            port,
            secret_namespace: secret_namespace.to_owned(),
            secret: format!("zkgate-webhook-tls-{port}"),
        }
    }

    /// The controller options that serve it.
    pub fn controller_args(&self) -> Vec<String> {
        [
            "--webhook-addr",
            &format!("127.0.0.1:{}", self.port),
            "--image",
            "registry.test/zkgate:test",
            "--webhook-names",
            "127.0.0.1",
            "--webhook-secret",
            &self.secret,
            "--webhook-secret-namespace",
            &self.secret_namespace,
            "--handout-url",
            &self.url(),
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// Its address.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The CA its certificate chains to, once the controller made it.
    pub async fn ca(&self, client: &kube::Client) -> String {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &self.secret_namespace);
        eventually(Duration::from_secs(30), "the webhook's CA", || async {
            let data = secrets.get_opt(&self.secret).await.ok()??.data?;
            String::from_utf8(data.get("ca.crt")?.0.clone()).ok()
        })
        .await
    }

    /// How a participant of `namespace` asks for its handout: a token of
    /// audience `audience` in a file of `dir`.
    pub async fn source(
        &self,
        client: &kube::Client,
        namespace: &str,
        audience: &str,
        dir: &std::path::Path,
    ) -> Source {
        let token_file = dir.join(format!("token-{namespace}-{audience}"));
        std::fs::write(&token_file, token(client, namespace, audience).await).unwrap();
        Source {
            urls: vec![self.url()],
            server_name: None,
            ca: self.ca(client).await,
            token_file,
        }
    }

    /// What `namespace`'s participants are handed, once there is something
    /// to hand out (the namespace's first reconcile made its credential).
    pub async fn handout(&self, client: &kube::Client, namespace: &str) -> Handout {
        let dir = tempfile::tempdir().unwrap();
        let source = self
            .source(client, namespace, zkgate::handout::AUDIENCE, dir.path())
            .await;
        source
            .fetch(Some(Duration::from_secs(60)))
            .await
            .unwrap_or_else(|e| panic!("no handout for {namespace}: {e}"))
    }

    /// `namespace`'s credential, as handed out.
    pub async fn credential(&self, client: &kube::Client, namespace: &str) -> Credential {
        let auth = self
            .handout(client, namespace)
            .await
            .auth
            .expect("a credential in the handout");
        Credential::parse(&auth).unwrap()
    }

    /// The environment of a `zkgate` participant command of `namespace`
    /// that gets its credentials from this handout (the token in `dir`).
    pub async fn env(
        &self,
        client: &kube::Client,
        namespace: &str,
        dir: &std::path::Path,
    ) -> Vec<(String, String)> {
        let source = self
            .source(client, namespace, zkgate::handout::AUDIENCE, dir)
            .await;
        vec![
            ("ZKGATE_CREDENTIALS_URL".into(), self.url()),
            ("ZKGATE_CREDENTIALS_CA".into(), source.ca),
            (
                "ZKGATE_CREDENTIALS_TOKEN_FILE".into(),
                source.token_file.to_string_lossy().into_owned(),
            ),
        ]
    }
}

/// A token of `namespace`'s ServiceAccount [`SERVICE_ACCOUNT`] (made if
/// missing) for `audience`, from the API server's TokenRequest.
pub async fn token(client: &kube::Client, namespace: &str, audience: &str) -> String {
    token_of(client, namespace, SERVICE_ACCOUNT, audience).await
}

/// A token of `namespace`'s ServiceAccount `account` (made if missing: the
/// test API server runs no ServiceAccount controller) for `audience`.
pub async fn token_of(
    client: &kube::Client,
    namespace: &str,
    account: &str,
    audience: &str,
) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let name = account;
    let account: ServiceAccount = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name }
    }))
    .unwrap();
    match accounts.create(&PostParams::default(), &account).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("cannot make the ServiceAccount: {e}"),
    }
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.to_owned()],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("a token")
        .status
        .expect("the token")
        .token
}
