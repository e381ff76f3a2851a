//! GEOPOS, GEOHASH, GEODIST and the searches, on sorted sets whose scores are geohashes
//! (`crate::geo`). A search's arguments are read here, in Redis 7.0's order, because a
//! FROMMEMBER (or GEORADIUSBYMEMBER's member) is looked up while the options are read.

use bytes::Bytes;
use chorus_resp::{Double, Value};

use super::zsets::score_bounds;
use super::{KeyType, KvState};
use crate::command::{
    metres_per_unit, parse_i64, parse_score, position, syntax_error, GeoRead, GeoSearch, ScoreBound, SearchCommand,
};
use crate::geo::{self, Extent, Shape};

/// How a search orders what it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    None,
    Nearest,
    Farthest,
}

/// A member a search found: where it is, its score, and its distance from the centre in the
/// search's unit.
struct Found {
    member: Bytes,
    score: f64,
    longitude: f64,
    latitude: f64,
    distance: f64,
}

/// What a search asked for and what it found (nothing when the set does not exist).
pub(super) struct Searched {
    found: Vec<Found>,
    with_distance: bool,
    with_hash: bool,
    with_coordinates: bool,
    /// GEOSEARCHSTORE's STOREDIST, GEORADIUS's STOREDIST: store distances, not positions.
    store_distances: bool,
}

impl Searched {
    /// The members and scores a storing search writes.
    pub(super) fn stored(self) -> Vec<(Bytes, f64)> {
        let store_distances = self.store_distances;
        self.found
            .into_iter()
            .map(|f| (f.member, if store_distances { f.distance } else { f.score }))
            .collect()
    }

    fn reply(self) -> Value {
        let decorated = self.with_distance || self.with_hash || self.with_coordinates;
        Value::array(
            self.found
                .into_iter()
                .map(|f| {
                    if !decorated {
                        return Value::bulk(f.member);
                    }
                    let mut item = vec![Value::bulk(f.member)];
                    if self.with_distance {
                        item.push(Value::bulk(geo::distance_text(f.distance)));
                    }
                    if self.with_hash {
                        item.push(Value::Integer(f.score as i64));
                    }
                    if self.with_coordinates {
                        item.push(Value::array(vec![
                            Value::HumanDouble(Double(f.longitude)),
                            Value::HumanDouble(Double(f.latitude)),
                        ]));
                    }
                    Value::array(item)
                })
                .collect(),
        )
    }
}

fn error(message: impl Into<String>) -> Value {
    Value::error(message.into())
}

/// A non-negative distance (`what` names it in the error) and its unit's metres.
fn extent_arg(value: &[u8], unit: &[u8], what: &str) -> Result<(f64, f64), Value> {
    let value = parse_score(value).ok_or_else(|| error(format!("ERR need numeric {what}")))?;
    if value < 0.0 {
        return Err(error("ERR radius cannot be negative"));
    }
    let metres = metres_per_unit(unit).map_err(Value::error)?;
    Ok((value, metres))
}

impl KvState {
    /// The position `member` of sorted set `key` stands for, if it is a member.
    fn geo_position(&mut self, key: &[u8], member: &[u8]) -> Option<(f64, f64)> {
        self.zscore(key, member).map(geo::position_of)
    }

    pub(super) fn read_geo(&mut self, read: &GeoRead) -> Result<Value, Value> {
        Ok(match read {
            GeoRead::Pos { key, members } => {
                self.type_check(key, KeyType::Zset)?;
                Value::array(
                    members
                        .iter()
                        .map(|member| match self.geo_position(key, member) {
                            None => Value::Array(None),
                            Some((longitude, latitude)) => Value::array(vec![
                                Value::HumanDouble(Double(longitude)),
                                Value::HumanDouble(Double(latitude)),
                            ]),
                        })
                        .collect(),
                )
            }
            GeoRead::Hash { key, members } => {
                self.type_check(key, KeyType::Zset)?;
                Value::array(
                    members
                        .iter()
                        .map(|member| match self.zscore(key, member) {
                            None => Value::null(),
                            Some(score) => Value::bulk(geo::geohash_text(score)),
                        })
                        .collect(),
                )
            }
            GeoRead::Dist {
                key,
                members: [a, b],
                metres_per_unit,
            } => {
                if !self.type_check(key, KeyType::Zset)? {
                    return Ok(Value::null());
                }
                match (self.geo_position(key, a), self.geo_position(key, b)) {
                    (Some(a), Some(b)) => Value::bulk(geo::distance_text(
                        geo::distance(a.0, a.1, b.0, b.1) / metres_per_unit.0,
                    )),
                    _ => Value::null(),
                }
            }
            GeoRead::Search(search) => self
                .geo_search(search)?
                .map_or_else(|| Value::array(Vec::new()), Searched::reply),
        })
    }

    /// Runs a search as Redis 7.0's `georadiusGeneric` does: the source's type, the centre and
    /// extent, the options in order, their combinations, then the search. `None` when the source
    /// does not exist (a storing search then empties its destination).
    pub(super) fn geo_search(&mut self, search: &GeoSearch) -> Result<Option<Searched>, Value> {
        let source = search.source().clone();
        let exists = self.type_check(&source, KeyType::Zset)?;
        let args = &search.args;
        let member_position = |state: &mut KvState, member: &[u8]| {
            state
                .geo_position(&source, member)
                .ok_or_else(|| error("ERR could not decode requested zset member"))
        };
        let mut center = None;
        let mut extent = None;
        let mut unit_metres = 1.0;
        let (by_search, read_only, options_at) = match search.command {
            SearchCommand::Radius { read_only } => {
                let (longitude, latitude) = position(&args[1], &args[2]).map_err(Value::error)?;
                center = Some((longitude, latitude));
                let (radius, metres) = extent_arg(&args[3], &args[4], "radius")?;
                (extent, unit_metres) = (Some(Extent::Radius(radius)), metres);
                (false, read_only, 5)
            }
            SearchCommand::RadiusByMember { read_only } => {
                if exists {
                    center = Some(member_position(self, &args[1])?);
                    let (radius, metres) = extent_arg(&args[2], &args[3], "radius")?;
                    (extent, unit_metres) = (Some(Extent::Radius(radius)), metres);
                }
                (false, read_only, 4)
            }
            SearchCommand::Search => (true, true, 1),
            SearchCommand::SearchStore => (true, false, 2),
        };
        let mut with_distance = false;
        let mut with_hash = false;
        let mut with_coordinates = false;
        let mut any = false;
        let mut order = Order::None;
        let mut count = 0;
        let mut store = (search.command == SearchCommand::SearchStore).then(|| args[0].clone());
        let mut store_distances = false;
        let (mut from_member, mut from_position, mut by_radius, mut by_box) = (false, false, false, false);
        let options = &args[options_at..];
        let mut i = 0;
        while i < options.len() {
            let remaining = options.len() - i - 1;
            let word = options[i].to_ascii_lowercase();
            match word.as_slice() {
                b"withdist" => with_distance = true,
                b"withhash" => with_hash = true,
                b"withcoord" => with_coordinates = true,
                b"any" => any = true,
                b"asc" => order = Order::Nearest,
                b"desc" => order = Order::Farthest,
                b"count" if remaining >= 1 => {
                    count = parse_i64(&options[i + 1]).map_err(Value::error)?;
                    if count <= 0 {
                        return Err(error("ERR COUNT must be > 0"));
                    }
                    i += 1;
                }
                b"store" | b"storedist" if remaining >= 1 && !read_only && !by_search => {
                    store = Some(options[i + 1].clone());
                    store_distances = word.as_slice() == b"storedist";
                    i += 1;
                }
                b"storedist" if search.command == SearchCommand::SearchStore => store_distances = true,
                b"frommember" if remaining >= 1 && by_search && !from_position => {
                    if exists {
                        center = Some(member_position(self, &options[i + 1])?);
                    }
                    from_member = true;
                    i += 1;
                }
                b"fromlonlat" if remaining >= 2 && by_search && !from_member => {
                    center = Some(position(&options[i + 1], &options[i + 2]).map_err(Value::error)?);
                    from_position = true;
                    i += 2;
                }
                b"byradius" if remaining >= 2 && by_search && !by_box => {
                    let (radius, metres) = extent_arg(&options[i + 1], &options[i + 2], "radius")?;
                    (extent, unit_metres) = (Some(Extent::Radius(radius)), metres);
                    by_radius = true;
                    i += 2;
                }
                b"bybox" if remaining >= 3 && by_search && !by_radius => {
                    let width = parse_score(&options[i + 1]).ok_or_else(|| error("ERR need numeric width"))?;
                    let height = parse_score(&options[i + 2]).ok_or_else(|| error("ERR need numeric height"))?;
                    if width < 0.0 || height < 0.0 {
                        return Err(error("ERR height or width cannot be negative"));
                    }
                    unit_metres = metres_per_unit(&options[i + 3]).map_err(Value::error)?;
                    extent = Some(Extent::Box { width, height });
                    by_box = true;
                    i += 3;
                }
                _ => return Err(Value::error(syntax_error())),
            }
            i += 1;
        }
        if store.is_some() && (with_distance || with_hash || with_coordinates) {
            return Err(error(if search.command == SearchCommand::SearchStore {
                "ERR GEOSEARCHSTORE is not compatible with WITHDIST, WITHHASH and WITHCOORD options"
            } else {
                "ERR STORE option in GEORADIUS is not compatible with WITHDIST, WITHHASH and WITHCOORD options"
            }));
        }
        let typed_name = String::from_utf8_lossy(&search.name);
        if by_search && !(from_member || from_position) {
            return Err(error(format!(
                "ERR exactly one of FROMMEMBER or FROMLONLAT can be specified for {typed_name}"
            )));
        }
        if by_search && !(by_radius || by_box) {
            return Err(error(format!(
                "ERR exactly one of BYRADIUS and BYBOX can be specified for {typed_name}"
            )));
        }
        if any && count == 0 {
            return Err(error("ERR the ANY argument requires COUNT argument"));
        }
        // The keys a storing search was routed by must be the ones it writes.
        if store.as_ref() != search.destination() {
            return Err(Value::error(syntax_error()));
        }
        if !exists {
            return Ok(None);
        }
        if count != 0 && order == Order::None && !any {
            order = Order::Nearest;
        }
        let (Some((longitude, latitude)), Some(extent)) = (center, extent) else {
            unreachable!("an existing set's search has its centre and extent, or was refused above");
        };
        let shape = Shape {
            longitude,
            latitude,
            extent,
            metres_per_unit: unit_metres,
        };
        let limit = if any { count as usize } else { 0 };
        let mut found = Vec::new();
        'cells: for (min, max) in shape.score_ranges() {
            if limit > 0 && found.len() >= limit {
                break;
            }
            let bounds = score_bounds(
                &ScoreBound {
                    score: Double(min),
                    exclusive: false,
                },
                &ScoreBound {
                    score: Double(max),
                    exclusive: true,
                },
            );
            for (member, score) in self.zset_records(&source, &bounds, 0, usize::MAX, false) {
                if let Some((longitude, latitude, distance_m)) = shape.locate(score) {
                    found.push(Found {
                        member,
                        score,
                        longitude,
                        latitude,
                        distance: distance_m,
                    });
                }
                if limit > 0 && found.len() >= limit {
                    break 'cells;
                }
            }
        }
        let by_distance = |a: &Found, b: &Found| a.distance.partial_cmp(&b.distance).expect("distances are numbers");
        match order {
            Order::None => {}
            Order::Nearest => found.sort_by(by_distance),
            Order::Farthest => found.sort_by(|a, b| by_distance(b, a)),
        }
        if count > 0 {
            found.truncate(count as usize);
        }
        for f in &mut found {
            f.distance /= unit_metres;
        }
        Ok(Some(Searched {
            found,
            with_distance,
            with_hash,
            with_coordinates,
            store_distances,
        }))
    }
}
