//! Little Compute's control-plane HTTP API as a library: router, DTOs, OpenAPI, authorization, error mapping.
