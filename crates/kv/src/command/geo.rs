//! Geospatial commands on sorted sets (the scores are geohashes, `crate::geo`): GEOADD is a ZADD
//! of the positions' scores; GEOPOS, GEOHASH and GEODIST read scores; GEOSEARCH, GEOSEARCHSTORE,
//! GEORADIUS and GEORADIUSBYMEMBER (and their `_RO` forms) keep their arguments and are parsed
//! where they run, with the set in hand, because Redis reads a FROMMEMBER's position in the middle
//! of its options and so answers errors in that order.

use bytes::Bytes;
use chorus_resp::Double;

use super::zsets::{parse_score, ZaddOptions, ZsetWrite};
use super::{arity_checks, syntax_error, Command, CommandError, Read, SetCondition, Write};
use crate::geo;

/// Reads of geospatial indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GeoRead {
    Pos {
        key: Bytes,
        members: Vec<Bytes>,
    },
    Hash {
        key: Bytes,
        members: Vec<Bytes>,
    },
    /// GEODIST in metres divided by `metres_per_unit` (the unit was checked before the key, as
    /// in Redis).
    Dist {
        key: Bytes,
        members: [Bytes; 2],
        metres_per_unit: Double,
    },
    Search(GeoSearch),
}

/// Which search command, which decides where its arguments are and which options it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchCommand {
    /// GEORADIUS (`read_only`: GEORADIUS_RO, which refuses STORE).
    Radius {
        read_only: bool,
    },
    /// GEORADIUSBYMEMBER (and its `_RO` form).
    RadiusByMember {
        read_only: bool,
    },
    Search,
    /// GEOSEARCHSTORE: the destination first, then the source.
    SearchStore,
}

/// A search as given: the command, its name as the client wrote it (errors quote it), and its
/// arguments after the name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeoSearch {
    pub command: SearchCommand,
    pub name: Bytes,
    pub args: Vec<Bytes>,
}

impl GeoSearch {
    /// The sorted set searched.
    pub fn source(&self) -> &Bytes {
        match self.command {
            SearchCommand::SearchStore => &self.args[1],
            _ => &self.args[0],
        }
    }

    /// Where the search stores what it finds, if anywhere: GEOSEARCHSTORE's destination, or the
    /// key after GEORADIUS's last STORE or STOREDIST (as Redis finds the keys).
    pub fn destination(&self) -> Option<&Bytes> {
        match self.command {
            SearchCommand::SearchStore => Some(&self.args[0]),
            SearchCommand::Search
            | SearchCommand::Radius { read_only: true }
            | SearchCommand::RadiusByMember { read_only: true } => None,
            SearchCommand::Radius { read_only: false } | SearchCommand::RadiusByMember { read_only: false } => {
                // From the fifth argument on, as Redis's key finder looks.
                let mut found = None;
                let mut i = 4;
                while i + 1 < self.args.len() {
                    let word = &self.args[i];
                    if word.eq_ignore_ascii_case(b"store") || word.eq_ignore_ascii_case(b"storedist") {
                        found = Some(&self.args[i + 1]);
                        i += 1;
                    }
                    i += 1;
                }
                found
            }
        }
    }

    pub fn keys(&self) -> Vec<Bytes> {
        std::iter::once(self.source())
            .chain(self.destination())
            .cloned()
            .collect()
    }
}

/// A unit's metres, or Redis's error.
pub fn metres_per_unit(unit: &[u8]) -> Result<f64, CommandError> {
    match unit.to_ascii_lowercase().as_slice() {
        b"m" => Ok(1.0),
        b"km" => Ok(1000.0),
        b"ft" => Ok(0.3048),
        b"mi" => Ok(1609.34),
        _ => Err("ERR unsupported unit provided. please use M, KM, FT, MI".into()),
    }
}

/// A longitude and latitude, or Redis's error (each must be a float, the pair within limits).
pub fn position(longitude: &[u8], latitude: &[u8]) -> Result<(f64, f64), CommandError> {
    let float = |arg: &[u8]| parse_score(arg).ok_or_else(|| CommandError::from("ERR value is not a valid float"));
    let (longitude, latitude) = (float(longitude)?, float(latitude)?);
    if !(geo::LONGITUDE_MIN..=geo::LONGITUDE_MAX).contains(&longitude)
        || !(geo::LATITUDE_MIN..=geo::LATITUDE_MAX).contains(&latitude)
    {
        return Err(format!(
            "ERR invalid longitude,latitude pair {longitude:.6},{latitude:.6}"
        ));
    }
    Ok((longitude, latitude))
}

/// GEOADD: a ZADD (NX, XX, CH) of each member at its position's score.
fn geoadd(rest: &[Bytes]) -> Result<ZsetWrite, CommandError> {
    let (mut nx, mut xx, mut ch) = (false, false, false);
    let mut at = 1;
    while let Some(word) = rest.get(at) {
        match word.to_ascii_lowercase().as_slice() {
            b"nx" => nx = true,
            b"xx" => xx = true,
            b"ch" => ch = true,
            _ => break,
        }
        at += 1;
    }
    let triples = &rest[at..];
    if triples.is_empty() || !triples.len().is_multiple_of(3) || (nx && xx) {
        return Err(syntax_error());
    }
    let pairs = triples
        .chunks_exact(3)
        .map(|triple| {
            let (longitude, latitude) = position(&triple[0], &triple[1])?;
            let score = geo::score_of(longitude, latitude).expect("a position within the limits has a score");
            Ok((Double(score), triple[2].clone()))
        })
        .collect::<Result<Vec<_>, CommandError>>()?;
    Ok(ZsetWrite::Add {
        key: rest[0].clone(),
        options: ZaddOptions {
            condition: SetCondition::from_flags(nx, xx),
            only: None,
            count_changed: ch,
            increment: false,
        },
        pairs,
    })
}

pub(super) fn parse(name: &str, rest: &[Bytes], typed_name: &Bytes) -> Option<Result<Command, CommandError>> {
    let (_, at_least) = arity_checks(name, rest.len());
    let read = |r: GeoRead| Command::Read(Read::Geo(r));
    let search = |command: SearchCommand| {
        let search = GeoSearch {
            command,
            name: typed_name.clone(),
            args: rest.to_vec(),
        };
        if search.destination().is_some() {
            Command::Write(Write::Zsets(ZsetWrite::GeoStore(search)))
        } else {
            Command::Read(Read::Geo(GeoRead::Search(search)))
        }
    };
    let parsed = (|| -> Result<Option<Command>, CommandError> {
        Ok(Some(match name {
            "geoadd" => {
                at_least(4)?;
                Command::Write(Write::Zsets(geoadd(rest)?))
            }
            "geopos" | "geohash" => {
                at_least(1)?;
                let (key, members) = (rest[0].clone(), rest[1..].to_vec());
                read(if name == "geopos" {
                    GeoRead::Pos { key, members }
                } else {
                    GeoRead::Hash { key, members }
                })
            }
            "geodist" => {
                at_least(3)?;
                let metres_per_unit = match rest.len() {
                    3 => 1.0,
                    4 => metres_per_unit(&rest[3])?,
                    _ => return Err(syntax_error()),
                };
                read(GeoRead::Dist {
                    key: rest[0].clone(),
                    members: [rest[1].clone(), rest[2].clone()],
                    metres_per_unit: Double(metres_per_unit),
                })
            }
            "georadius" | "georadius_ro" => {
                at_least(5)?;
                search(SearchCommand::Radius {
                    read_only: name == "georadius_ro",
                })
            }
            "georadiusbymember" | "georadiusbymember_ro" => {
                at_least(4)?;
                search(SearchCommand::RadiusByMember {
                    read_only: name == "georadiusbymember_ro",
                })
            }
            "geosearch" => {
                at_least(6)?;
                search(SearchCommand::Search)
            }
            "geosearchstore" => {
                at_least(7)?;
                search(SearchCommand::SearchStore)
            }
            _ => return Ok(None),
        }))
    })();
    parsed.transpose()
}
