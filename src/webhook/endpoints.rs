//! The webhook Service's endpoints, as its EndpointSlices list them.
//!
//! Two things read them: the credential handout, which tells injected
//! containers every replica's address (pods reach those wherever Service
//! addresses are not routed for them), and a stopping replica, which waits
//! until it is no longer listed as ready before it stops serving
//! ([`super::drain`]). EndpointSlices (`discovery.k8s.io/v1`) are what
//! kube-proxy follows; the core `Endpoints` API they replace is deprecated
//! since Kubernetes 1.33 (and capped at 1,000 addresses).

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};

/// The label the EndpointSlice controller puts on a Service's slices.
const SERVICE_NAME: &str = "kubernetes.io/service-name";

/// One address of the Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The pod's address.
    pub ip: String,
    /// The slice's first port, the webhook's.
    pub port: Option<i32>,
    /// Whether the Service sends new connections there: the endpoint's
    /// `ready` condition (unset counts as ready, as the API says).
    pub ready: bool,
}

/// Every address of the Service `name` in `namespace`, ready or not, from
/// all of its slices.
pub async fn of_service(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Vec<Endpoint>, kube::Error> {
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("{SERVICE_NAME}={name}")))
        .await?;
    Ok(slices.items.iter().flat_map(endpoints_of).collect())
}

/// The addresses one slice lists.
fn endpoints_of(slice: &EndpointSlice) -> Vec<Endpoint> {
    let port = slice
        .ports
        .as_ref()
        .and_then(|ports| ports.first())
        .and_then(|p| p.port);
    slice
        .endpoints
        .iter()
        .flat_map(|endpoint| {
            let ready = endpoint
                .conditions
                .as_ref()
                .and_then(|c| c.ready)
                .unwrap_or(true);
            endpoint.addresses.iter().map(move |ip| Endpoint {
                ip: ip.clone(),
                port,
                ready,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{
        Endpoint as SliceEndpoint, EndpointConditions, EndpointPort,
    };

    fn endpoint(ip: &str, ready: Option<bool>) -> SliceEndpoint {
        SliceEndpoint {
            addresses: vec![ip.to_owned()],
            conditions: Some(EndpointConditions {
                ready,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_slice_lists_each_address_with_its_readiness_and_the_port() {
        let slice = EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: vec![
                endpoint("10.0.0.1", Some(true)),
                endpoint("10.0.0.2", Some(false)),
                endpoint("10.0.0.3", None),
            ],
            ports: Some(vec![EndpointPort {
                port: Some(8443),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let found = endpoints_of(&slice);
        let seen: Vec<(&str, Option<i32>, bool)> = found
            .iter()
            .map(|e| (e.ip.as_str(), e.port, e.ready))
            .collect();
        assert_eq!(
            seen,
            [
                ("10.0.0.1", Some(8443), true),
                ("10.0.0.2", Some(8443), false),
                // No condition: ready, as the API defines it.
                ("10.0.0.3", Some(8443), true),
            ]
        );
    }
}
