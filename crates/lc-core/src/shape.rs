//! Shapes: the named resource sets of an instance and the capacity units
//! each reserves on the tenant's Tollgate account.
//!
//! | name        | memory  | pids | cpu_shares | network | units |
//! |-------------|---------|------|------------|---------|-------|
//! | `small`     | 256 MiB |   64 |        512 | off     | 1     |
//! | `medium`    | 1 GiB   |  256 |       1024 | off     | 2     |
//! | `small-net` | 256 MiB |   64 |        512 | on      | 1     |

use serde::Serialize;

use crate::error::LcError;

/// The resources of an instance and the units it reserves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Shape {
    /// Its name.
    pub name: &'static str,
    /// The memory limit, in bytes.
    pub memory_bytes: u64,
    /// The most processes and threads at once.
    pub pids_max: u32,
    /// The relative CPU weight (cgroup v1 `cpu.shares`).
    pub cpu_shares: u32,
    /// Whether the instance may reach the network.
    pub network: bool,
    /// Units one Reservation of this shape holds.
    pub units: i64,
}

const MIB: u64 = 1024 * 1024;

/// `small`: 256 MiB, 64 pids, 512 shares, no network, 1 unit.
pub const SMALL: Shape = Shape {
    name: "small",
    memory_bytes: 256 * MIB,
    pids_max: 64,
    cpu_shares: 512,
    network: false,
    units: 1,
};

/// `medium`: 1 GiB, 256 pids, 1024 shares, no network, 2 units.
pub const MEDIUM: Shape = Shape {
    name: "medium",
    memory_bytes: 1024 * MIB,
    pids_max: 256,
    cpu_shares: 1024,
    network: false,
    units: 2,
};

/// `small-net`: as `small` with the network on, 1 unit.
pub const SMALL_NET: Shape = Shape {
    name: "small-net",
    network: true,
    ..SMALL
};

/// Every shape, in the order listed to users.
pub const SHAPES: [Shape; 3] = [SMALL, MEDIUM, SMALL_NET];

impl Shape {
    /// The shape named `name`.
    ///
    /// # Errors
    /// [`LcError::InvalidShape`] for an unknown name.
    pub fn by_name(name: &str) -> Result<Shape, LcError> {
        SHAPES
            .iter()
            .find(|s| s.name == name)
            .copied()
            .ok_or_else(|| LcError::InvalidShape {
                name: name.chars().take(64).collect(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_shapes() {
        assert_eq!(Shape::by_name("small").unwrap().memory_bytes, 268_435_456);
        assert_eq!(
            Shape::by_name("medium").unwrap().memory_bytes,
            1_073_741_824
        );
        assert_eq!(Shape::by_name("medium").unwrap().units, 2);
        let net = Shape::by_name("small-net").unwrap();
        assert_eq!((net.network, net.units, net.pids_max), (true, 1, 64));
        assert_eq!(Shape::by_name("large").unwrap_err().code(), "invalid_shape");
    }

    #[test]
    fn every_shape_exactly() {
        let small = Shape {
            name: "small",
            memory_bytes: 268_435_456,
            pids_max: 64,
            cpu_shares: 512,
            network: false,
            units: 1,
        };
        let medium = Shape {
            name: "medium",
            memory_bytes: 1_073_741_824,
            pids_max: 256,
            cpu_shares: 1024,
            network: false,
            units: 2,
        };
        let small_net = Shape {
            name: "small-net",
            memory_bytes: 268_435_456,
            pids_max: 64,
            cpu_shares: 512,
            network: true,
            units: 1,
        };
        assert_eq!(SHAPES, [small, medium, small_net]);
        assert_eq!((SMALL, MEDIUM, SMALL_NET), (small, medium, small_net));
        for s in [small, medium, small_net] {
            assert_eq!(Shape::by_name(s.name), Ok(s));
        }
    }

    #[test]
    fn unknown_names_are_refused_with_the_name_cut_to_64_chars() {
        for name in [
            "",
            "Small",
            "small ",
            " small",
            "smal",
            "small-net2",
            "large",
        ] {
            assert_eq!(
                Shape::by_name(name),
                Err(LcError::InvalidShape { name: name.into() }),
                "{name:?}"
            );
        }
        let long = "é".repeat(65);
        assert_eq!(
            Shape::by_name(&long),
            Err(LcError::InvalidShape {
                name: "é".repeat(64)
            })
        );
    }
}
