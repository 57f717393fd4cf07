//! The endpoint-picker protocol over Envoy's ext_proc messages, as pure functions: what
//! the proxy tells the picker (request headers as text, the subset hint, the endpoint that
//! served the response, the processing mode) and the `ProcessingResponse`s the picker
//! answers with (header mutations with the `envoy.lb` metadata, body continuations and
//! streamed echoes, immediate 503s).
//!
//! Names are the Gateway API Inference Extension's (protocol v1): the header and metadata
//! key `x-gateway-destination-endpoint`, the namespaces `envoy.lb` and
//! `envoy.lb.subset_hint`, the subset key `x-gateway-destination-endpoint-subset`, and
//! the served key `x-gateway-destination-endpoint-served`.

use cohort_ext_proc_proto::core::{
    header_value_option::HeaderAppendAction, HeaderMap, HeaderValue, HeaderValueOption, Metadata,
};
use cohort_ext_proc_proto::ext_proc::{
    body_mutation, common_response::ResponseStatus, processing_response, BodyMutation,
    BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingRequest, ProcessingResponse, StreamedBodyResponse, TrailersResponse,
};
use cohort_ext_proc_proto::mode::processing_mode::BodySendMode;
use cohort_ext_proc_proto::prost_types::{value::Kind, Struct, Value};
use cohort_ext_proc_proto::types::HttpStatus;

/// The destination header and `envoy.lb` metadata key.
pub const DESTINATION: &str = cohort_fingerprint::headers::ENDPOINT;
/// The metadata namespace of the destination and of the served endpoint.
pub const LB_NAMESPACE: &str = "envoy.lb";
/// The metadata namespace of the subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The subset hint's key.
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// The served endpoint's key (metadata and response header).
pub const SERVED_KEY: &str = "x-gateway-destination-endpoint-served";

/// How the proxy sends the request body (its `processing_mode.request_body_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyMode {
    /// `BUFFERED` (or no protocol configuration sent): the whole body in one message.
    Buffered,
    /// `FULL_DUPLEX_STREAMED`: the body comes in chunks the picker sends back.
    Duplex,
    /// `NONE`, `STREAMED`, `BUFFERED_PARTIAL`: the picker decides on the headers alone
    /// (docs/CONTRACT.md, "Endpoint picker") and answers each chunk it is sent unchanged.
    Other,
}

/// The request body mode from the stream's first message (`protocol_config`, which Envoy
/// sends since 1.33); without one, buffered.
pub fn request_body_mode(request: &ProcessingRequest) -> BodyMode {
    body_mode(
        request
            .protocol_config
            .as_ref()
            .map(|c| c.request_body_mode),
    )
}

/// The response body mode, as [`request_body_mode`].
pub fn response_body_mode(request: &ProcessingRequest) -> BodyMode {
    body_mode(
        request
            .protocol_config
            .as_ref()
            .map(|c| c.response_body_mode),
    )
}

fn body_mode(mode: Option<i32>) -> BodyMode {
    match mode {
        Some(m) if m == BodySendMode::FullDuplexStreamed as i32 => BodyMode::Duplex,
        None => BodyMode::Buffered,
        Some(m) if m == BodySendMode::Buffered as i32 => BodyMode::Buffered,
        Some(_) => BodyMode::Other,
    }
}

/// Headers as (lowercase name, text value): Envoy sends the value in `raw_value` (bytes),
/// older versions in `value`; bytes that are not UTF-8 are read lossily, as the filter
/// reads them ([`cohort_filter::decision::headers_as_text`]).
pub fn headers_of(map: Option<&HeaderMap>) -> Vec<(String, String)> {
    let Some(map) = map else { return Vec::new() };
    cohort_filter::decision::headers_as_text(
        map.headers
            .iter()
            .map(|h| {
                let value = if h.raw_value.is_empty() {
                    h.value.clone().into_bytes()
                } else {
                    h.raw_value.clone()
                };
                (h.key.to_ascii_lowercase(), value)
            })
            .collect(),
    )
}

/// The first value of header `name`.
pub fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn field<'m>(metadata: Option<&'m Metadata>, namespace: &str, key: &str) -> Option<&'m Kind> {
    metadata?
        .filter_metadata
        .get(namespace)?
        .fields
        .get(key)?
        .kind
        .as_ref()
}

/// Endpoints of a comma-separated list, trimmed, empty items dropped.
pub fn split_endpoints(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The subset hint: `None` when the proxy set none (pick from the whole pool), else the
/// endpoints it allows, possibly none. A list of strings, or one comma-separated string.
pub fn subset_hint(metadata: Option<&Metadata>) -> Option<Vec<String>> {
    match field(metadata, SUBSET_NAMESPACE, SUBSET_KEY)? {
        Kind::ListValue(list) => Some(
            list.values
                .iter()
                .filter_map(|v| match &v.kind {
                    Some(Kind::StringValue(s)) => Some(split_endpoints(s)),
                    _ => None,
                })
                .flatten()
                .collect(),
        ),
        Kind::StringValue(s) => Some(split_endpoints(s)),
        // Anything else allows nothing (the proxy meant to restrict).
        _ => Some(Vec::new()),
    }
}

/// The endpoint that served the response, from the `envoy.lb` metadata or the response
/// header (the first of a list).
pub fn served_endpoint(
    metadata: Option<&Metadata>,
    response_headers: &[(String, String)],
) -> Option<String> {
    let from_metadata = match field(metadata, LB_NAMESPACE, SERVED_KEY) {
        Some(Kind::StringValue(s)) => Some(s.as_str()),
        _ => None,
    };
    from_metadata
        .or_else(|| header(response_headers, SERVED_KEY))
        .and_then(|list| split_endpoints(list).into_iter().next())
}

/// The response status (`:status`), 0 when absent or not a number.
pub fn status_of(response_headers: &[(String, String)]) -> u32 {
    header(response_headers, ":status")
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Request headers to set (overwriting) and to remove (a name in both is only set).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mutation {
    pub set: Vec<(String, String)>,
    pub remove: Vec<String>,
    /// The destination list, written as the header and as `envoy.lb` metadata alike.
    pub destination: Option<String>,
}

impl Mutation {
    fn header_mutation(&self) -> Option<HeaderMutation> {
        if self.set.is_empty() && self.remove.is_empty() && self.destination.is_none() {
            return None;
        }
        let destination = self
            .destination
            .as_ref()
            .map(|d| (DESTINATION.to_owned(), d.clone()));
        Some(HeaderMutation {
            set_headers: self
                .set
                .iter()
                .cloned()
                .chain(destination)
                .map(|(key, value)| HeaderValueOption {
                    header: Some(HeaderValue {
                        key,
                        value: String::new(),
                        raw_value: value.into_bytes(),
                    }),
                    append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
                    ..Default::default()
                })
                .collect(),
            // A name also set is overwritten instead: whichever order the proxy applies
            // the two lists in, the value written stays.
            remove_headers: self
                .remove
                .iter()
                .filter(|name| {
                    !self.set.iter().any(|(n, _)| n == *name)
                        && (self.destination.is_none() || *name != DESTINATION)
                })
                .cloned()
                .collect(),
        })
    }

    fn common(&self) -> CommonResponse {
        let header_mutation = self.header_mutation();
        CommonResponse {
            status: ResponseStatus::Continue as i32,
            // Routes may match the written headers (x-cohort-shard, …): route again.
            clear_route_cache: header_mutation
                .as_ref()
                .is_some_and(|m| !m.set_headers.is_empty()),
            header_mutation,
            ..Default::default()
        }
    }

    fn metadata(&self) -> Option<Struct> {
        let destination = self.destination.as_ref()?;
        let inner = Struct {
            fields: [(DESTINATION.to_owned(), string_value(destination))].into(),
        };
        Some(Struct {
            fields: [(
                LB_NAMESPACE.to_owned(),
                Value {
                    kind: Some(Kind::StructValue(inner)),
                },
            )]
            .into(),
        })
    }
}

fn string_value(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

/// A subset hint as the proxy writes it (tests).
#[cfg(test)]
pub fn subset_metadata(endpoints: &[&str]) -> Metadata {
    let list = Value {
        kind: Some(Kind::ListValue(
            cohort_ext_proc_proto::prost_types::ListValue {
                values: endpoints.iter().map(|e| string_value(e)).collect(),
            },
        )),
    };
    Metadata {
        filter_metadata: [(
            SUBSET_NAMESPACE.to_owned(),
            Struct {
                fields: [(SUBSET_KEY.to_owned(), list)].into(),
            },
        )]
        .into(),
        ..Default::default()
    }
}

/// The answer to `request_headers`, carrying `mutation` (and its metadata).
pub fn request_headers_response(mutation: &Mutation) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::RequestHeaders(
            HeadersResponse {
                response: Some(mutation.common()),
            },
        )),
        dynamic_metadata: mutation.metadata(),
        ..Default::default()
    }
}

/// The answer to a buffered `request_body`: continue, with `mutation` (header mutations
/// in a body answer take effect in `BUFFERED` mode).
pub fn request_body_response(mutation: &Mutation) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::RequestBody(BodyResponse {
            response: Some(mutation.common()),
        })),
        dynamic_metadata: mutation.metadata(),
        ..Default::default()
    }
}

/// A full-duplex body chunk sent back unchanged.
pub fn streamed_chunk(body: Vec<u8>, end_of_stream: bool, request: bool) -> ProcessingResponse {
    let body = BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::StreamedResponse(
                    StreamedBodyResponse {
                        body,
                        end_of_stream,
                        ..Default::default()
                    },
                )),
            }),
            ..Default::default()
        }),
    };
    ProcessingResponse {
        response: Some(if request {
            processing_response::Response::RequestBody(body)
        } else {
            processing_response::Response::ResponseBody(body)
        }),
        ..Default::default()
    }
}

/// The answer to `request_trailers` (unchanged).
pub fn request_trailers_response() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::RequestTrailers(
            TrailersResponse::default(),
        )),
        ..Default::default()
    }
}

/// The answer to `response_headers`: the headers in `set` added (overwriting), nothing
/// else changed.
pub fn response_headers_response(set: &[(String, String)]) -> ProcessingResponse {
    let mutation = Mutation {
        set: set.to_vec(),
        ..Mutation::default()
    };
    let response = mutation
        .header_mutation()
        .map(|header_mutation| CommonResponse {
            header_mutation: Some(header_mutation),
            ..Default::default()
        });
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseHeaders(
            HeadersResponse { response },
        )),
        ..Default::default()
    }
}

/// The answer to a buffered `response_body` (unchanged).
pub fn response_body_response() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseBody(
            BodyResponse::default(),
        )),
        ..Default::default()
    }
}

/// The answer to `response_trailers` (unchanged).
pub fn response_trailers_response() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseTrailers(
            TrailersResponse::default(),
        )),
        ..Default::default()
    }
}

/// A local reply of `status` with a plain-text `body`; `details` goes to Envoy's
/// `%RESPONSE_CODE_DETAILS%`.
pub fn immediate(status: u16, details: &str, body: &str) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ImmediateResponse(
            ImmediateResponse {
                status: Some(HttpStatus {
                    code: i32::from(status),
                }),
                body: body.as_bytes().to_vec(),
                details: details.to_owned(),
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &[u8])]) -> HeaderMap {
        HeaderMap {
            headers: pairs
                .iter()
                .map(|(k, v)| HeaderValue {
                    key: k.to_string(),
                    value: String::new(),
                    raw_value: v.to_vec(),
                })
                .collect(),
        }
    }

    #[test]
    fn headers_read_raw_values_lossily() {
        let headers = headers_of(Some(&map(&[(":path", b"/v1/x"), ("x-k", &[0xFF, b'a'])])));
        assert_eq!(header(&headers, ":path"), Some("/v1/x"));
        assert_eq!(header(&headers, "x-k"), Some("\u{FFFD}a"));
        let old = HeaderMap {
            headers: vec![HeaderValue {
                key: "X-Old".into(),
                value: "v".into(),
                raw_value: Vec::new(),
            }],
        };
        assert_eq!(header(&headers_of(Some(&old)), "x-old"), Some("v"));
    }

    #[test]
    fn the_subset_hint_is_a_list_or_a_string_and_absent_means_everyone() {
        assert_eq!(subset_hint(None), None);
        assert_eq!(subset_hint(Some(&Metadata::default())), None);
        let list = subset_metadata(&["10.0.0.1:8000", "10.0.0.2:8000"]);
        assert_eq!(
            subset_hint(Some(&list)),
            Some(vec!["10.0.0.1:8000".into(), "10.0.0.2:8000".into()])
        );
        assert_eq!(subset_hint(Some(&subset_metadata(&[]))), Some(vec![]));
        let mut string = Metadata::default();
        string.filter_metadata.insert(
            SUBSET_NAMESPACE.into(),
            Struct {
                fields: [(
                    SUBSET_KEY.into(),
                    string_value(" 10.0.0.1:8000, ,10.0.0.3:8000"),
                )]
                .into(),
            },
        );
        assert_eq!(
            subset_hint(Some(&string)),
            Some(vec!["10.0.0.1:8000".into(), "10.0.0.3:8000".into()])
        );
    }

    #[test]
    fn the_served_endpoint_comes_from_metadata_else_the_header() {
        let mut metadata = Metadata::default();
        metadata.filter_metadata.insert(
            LB_NAMESPACE.into(),
            Struct {
                fields: [(SERVED_KEY.into(), string_value("10.0.0.2:8000"))].into(),
            },
        );
        let headers = vec![(
            SERVED_KEY.to_owned(),
            "10.0.0.3:8000,10.0.0.4:8000".to_owned(),
        )];
        assert_eq!(
            served_endpoint(Some(&metadata), &headers).as_deref(),
            Some("10.0.0.2:8000")
        );
        assert_eq!(
            served_endpoint(None, &headers).as_deref(),
            Some("10.0.0.3:8000")
        );
        assert_eq!(served_endpoint(None, &[]), None);
        assert_eq!(status_of(&[(":status".into(), "503".into())]), 503);
        assert_eq!(status_of(&[]), 0);
    }

    #[test]
    fn the_destination_goes_into_the_header_and_the_metadata_alike() {
        let mutation = Mutation {
            set: vec![("x-cohort-shard".into(), "r0".into())],
            remove: vec![
                "x-cohort-key".into(),
                "x-cohort-shard".into(),
                DESTINATION.into(),
            ],
            destination: Some("10.0.0.1:8000,10.0.0.2:8000".into()),
        };
        let response = request_headers_response(&mutation);
        let Some(processing_response::Response::RequestHeaders(h)) = &response.response else {
            panic!("{response:?}")
        };
        let common = h.response.as_ref().unwrap();
        assert!(common.clear_route_cache);
        let m = common.header_mutation.as_ref().unwrap();
        assert_eq!(m.remove_headers, ["x-cohort-key"]);
        let set: Vec<(&str, &[u8])> = m
            .set_headers
            .iter()
            .map(|o| {
                let h = o.header.as_ref().unwrap();
                (h.key.as_str(), h.raw_value.as_slice())
            })
            .collect();
        assert_eq!(
            set,
            [
                ("x-cohort-shard", b"r0".as_slice()),
                (DESTINATION, b"10.0.0.1:8000,10.0.0.2:8000".as_slice())
            ]
        );
        let lb = &response.dynamic_metadata.as_ref().unwrap().fields[LB_NAMESPACE];
        let Some(Kind::StructValue(lb)) = &lb.kind else {
            panic!()
        };
        assert_eq!(
            lb.fields[DESTINATION].kind,
            Some(Kind::StringValue("10.0.0.1:8000,10.0.0.2:8000".into()))
        );
        // Nothing to change: a bare continue, no metadata, no route-cache clearing.
        let bare = request_body_response(&Mutation::default());
        assert!(bare.dynamic_metadata.is_none());
        let Some(processing_response::Response::RequestBody(b)) = &bare.response else {
            panic!()
        };
        assert!(!b.response.as_ref().unwrap().clear_route_cache);
    }
}
