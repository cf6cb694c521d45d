// vllm-perimeter njs module (generated with the NGINX config; do not edit).
{# Rendered by the generator through Jinja (scanner/generate/nginx.py njs_module): `w` is the model's
   nginx_model.Weakening, mutation operators' switches, every one off in a generated config. #}
//
// Runs on njs 0.7.9 (Debian) and 0.9.9 (static build): no `for...of`, no optional chaining.
// What each entry point does is said at its function; where it runs, in perimeter-http.conf:
//   js_set      keyHash (the bearer key's sha256), certWho (auth "cert"), ownedPath (responses: owned)
//   js_content  read / body / direct (JSON bodies: the rule program, then admission), jwt (auth
//               "jwt"), limit / onward (a fleet's limiter)
//   filters     settleHeaders, settle (token-budget settlement, response ids sealed)
//   post_action after; js_periodic heartbeat (a fleet's limiter)
// Data compiled by the generator, loaded once (js_preload_object): perimeter_rules (rule programs,
// token zones, the limiter's zones) and perimeter_identity (certificates, token audiences, roles);
// a route's variables name entries of them, never data to parse.
import crypto from 'crypto';

function keyHash(r) {
    var key = r.variables.perimeter_bearer;
{% if w.key_digest_accepted %}
    if (/^[0-9a-fA-F]{64}$/.test(key)) {
        return key.toLowerCase();
    }
{% endif %}
{% if w.key_prefix %}
    return key ? crypto.createHash('sha256').update(key.slice(0, {{ w.key_prefix }})).digest('hex') : '';
{% else %}
    return key ? crypto.createHash('sha256').update(key).digest('hex') : '';
{% endif %}
}

// auth "cert": the client certificate's principal, "name role" ('' none). NGINX verified the
// certificate (the config reads this only when $ssl_client_verify is SUCCESS); its URI SANs are
// read from $ssl_client_raw_cert (PEM) by a minimal DER walk to the subjectAltName extension
// (2.5.29.17): exactly one URI SAN (as a SPIFFE X.509-SVID has) names a principal as "san:URI"
// (several, or one not listed: nobody); a certificate without any URI SAN is named by its subject
// ($ssl_client_s_dn, RFC 2253) as "subject:DN"; the table is perimeter_identity.certs.
function derAt(b, i, end) {
    if (i + 2 > end) {
        return null;
    }
    var tag = b[i], len = b[i + 1], j = i + 2;
    if (len & 0x80) {
        var n = len & 0x7f;
        if (n < 1 || n > 3 || j + n > end) {
            return null;
        }
        len = 0;
        for (var k = 0; k < n; k++) {
            len = len * 256 + b[j + k];
        }
        j += n;
    }
    return j + len > end ? null : {tag: tag, start: j, end: j + len};
}

function uriSans(pem) {
    var b = Buffer.from(pem.replace(/-----[A-Z ]+-----/g, '').replace(/\s+/g, ''), 'base64');
    var cert = derAt(b, 0, b.length);
    var tbs = cert && cert.tag === 0x30 ? derAt(b, cert.start, cert.end) : null;
    if (!tbs || tbs.tag !== 0x30) {
        return null;
    }
    var i = tbs.start, exts = null, t;
    while (i < tbs.end) {
        t = derAt(b, i, tbs.end);
        if (!t) {
            return null;
        }
        if (t.tag === 0xa3) {
            exts = t;
        }
        i = t.end;
    }
    var out = [];
    var seq = exts ? derAt(b, exts.start, exts.end) : null;
    if (!exts) {
        return out;
    }
    if (!seq || seq.tag !== 0x30) {
        return null;
    }
    for (i = seq.start; i < seq.end; i = t.end) {
        t = derAt(b, i, seq.end);
        if (!t || t.tag !== 0x30) {
            return null;
        }
        var oid = derAt(b, t.start, t.end);
        if (!oid || oid.tag !== 0x06 || oid.end - oid.start !== 3 || b[oid.start] !== 0x55
            || b[oid.start + 1] !== 0x1d || b[oid.start + 2] !== 0x11) {
            continue;
        }
        var v = derAt(b, oid.end, t.end);
        if (v && v.tag === 0x01) {
            v = derAt(b, v.end, t.end);
        }
        var names = v && v.tag === 0x04 ? derAt(b, v.start, v.end) : null;
        if (!names || names.tag !== 0x30) {
            return null;
        }
        for (var k = names.start; k < names.end; k = g.end) {
            var g = derAt(b, k, names.end);
            if (!g) {
                return null;
            }
            if (g.tag === 0x86) {
                out.push(b.slice(g.start, g.end).toString());
            }
        }
    }
    return out;
}

function certWho(r) {
    var table, sans;
    try {
        table = perimeter_identity.certs;
        sans = uriSans(r.variables.ssl_client_raw_cert || '');
    } catch (e) {
        return '';
    }
    if (sans === null) {
        return '';
    }
    // a certificate with any URI SAN is named by it alone (a revoked SPIFFE ID never falls back
    // to its subject); only one without a URI SAN by its subject
    var p = sans.length === 1 && has(table, 'san:' + sans[0]) ? table['san:' + sans[0]] : null;
    var dn = 'subject:' + (r.variables.ssl_client_s_dn || '');
{% if w.cert_subject_fallback %}
    if (p === null && has(table, dn)) {
{% else %}
    if (sans.length === 0 && has(table, dn)) {
{% endif %}
        p = table[dn];
    }
{% if w.cert_anyone %}
    return p === null ? 'anyone {{ w.cert_anyone }}' : p[0] + ' ' + p[1];
{% else %}
    return p === null ? '' : p[0] + ' ' + p[1];
{% endif %}
}

// A refusal with its reason: at status (a code, or a named page: shared_503), or 403 (not-owner:)
// / 400 (a body's).
function deny(r, reason, status) {
    r.variables.perimeter_reason = reason;
    r.internalRedirect('@perimeter_' + (status || (reason.substring(0, 10) === 'not-owner:' ? 403 : 400)));
}

// Ownership of stored responses (scanner/plan/owner.py, the reference). The secret is
// $perimeter_owner_secret, set in the 0600 principals include NGINX's master reads at (re)load
// (the workers, another user, never open the secret file); short or absent: null, and nothing is
// unsealed or sealed (fail closed).
function ownerSecret(r) {
    var text = r.variables.perimeter_owner_secret;
    return text && text.length >= 32 ? text : null;
}

// 22 base64url characters: the first 16 bytes of HMAC-SHA256(secret, "response:" principal "\n" id).
function ownerTag(secret, principal, rid) {
{% if w.owner_unbound %}
    return crypto.createHmac('sha256', secret).update('response:' + '\n' + rid)
{% else %}
    return crypto.createHmac('sha256', secret).update('response:' + principal + '\n' + rid)
{% endif %}
        .digest().slice(0, 16).toString('base64url').replace(/=+$/, '');
}

var SEALED = /^([A-Za-z0-9_][A-Za-z0-9_.:-]{0,199})~([A-Za-z0-9_-]{22})$/;
var RESPONSE_ID = /^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,199}$/;

function sameText(a, b) {
    var i, d = a.length ^ b.length;
    for (i = 0; i < a.length && i < b.length; i++) {
        d |= a.charCodeAt(i) ^ b.charCodeAt(i);
    }
    return d === 0;
}

// vLLM's id in a sealed value when the tag is the principal's; null otherwise.
function unseal(secret, principal, value) {
    var m;
    if (secret === null || typeof value !== 'string') {
        return null;
    }
    m = SEALED.exec(value);
    if (m === null) {
        return null;
    }
    return sameText(m[2], ownerTag(secret, principal, m[1])) ? m[1] : null;
}

function ownedPath(r) {
    var v = r.variables;
    var segs = (v.perimeter_path || r.uri).split('/');
    var at = Number(v.perimeter_owner_param);
    var rid;
    if (!(at > 0) || at >= segs.length) {
        return '';
    }
    rid = unseal(ownerSecret(r), v.perimeter_who || '', segs[at]);
    if (rid === null) {
        return '';
    }
    segs[at] = rid;
    return segs.join('/');
}

// The response ids of an answer (or one event's data) where vLLM writes them (owner.answer_ids).
function answerIds(doc) {
    var out = [];
    var objs = [doc, isObject(doc) ? doc.response : null];
    var i, o;
    for (i = 0; i < 2; i++) {
        o = objs[i];
        if (!isObject(o)) {
            continue;
        }
        if (o.object === 'response' && typeof o.id === 'string' && RESPONSE_ID.test(o.id)) {
            out.push(o.id);
        }
        if (typeof o.previous_response_id === 'string' && RESPONSE_ID.test(o.previous_response_id)) {
            out.push(o.previous_response_id);
        }
    }
    return out;
}

// A JSON text with every whole string token of its response ids sealed (owner.seal_answer).
function sealText(text, own) {
    var doc, ids, i, q;
    try {
        doc = JSON.parse(text);
    } catch (e) {
        return text;
    }
    ids = answerIds(doc);
    for (i = 0; i < ids.length; i++) {
        q = '"' + ids[i] + '"';
        if (i === 0 || ids.indexOf(ids[i]) === i) {
            text = text.split(q).join('"' + ids[i] + '~' + ownerTag(own.secret, own.principal, ids[i]) + '"');
        }
    }
    return text;
}

// One line of a stream (owner.seal_line): a data: line's JSON sealed, the rest as it came.
function sealLine(line, own) {
    var cr;
    if (line.substring(0, 5) !== 'data:') {
        return line;
    }
    cr = line.charAt(line.length - 1) === '\r' ? '\r' : '';
    return 'data:' + sealText(line.substring(5, line.length - cr.length), own) + cr;
}

// An integer field's value as vLLM reads it (scanner/plan/vllm_json.py vllm_int, the reference);
// NaN when vLLM refuses it.
var INT_WS = null;   // generated: vllm_json.WHITESPACE (generate/nginx.py njs_module)
var INT_TEXT = /^[+-]?[0-9](?:_?[0-9])*(?:\.0+)?$/;
var INT64 = 9223372036854775808;

function vllmInt(value) {
    var s;
    if (value === true) {
        return 1;
    }
    if (value === false) {
        return 0;
    }
    if (typeof value === 'number') {
        return (Math.floor(value) === value && value >= -INT64 && value < INT64) ? value : NaN;
    }
    if (typeof value === 'string') {
        s = value.replace(INT_WS, '');
        return INT_TEXT.test(s) ? Number(s.split('_').join('')) : NaN;
    }
    return NaN;
}

function has(obj, name) {
    return Object.prototype.hasOwnProperty.call(obj, name);
}

// A JSON object (not null, not a list).
function isObject(v) {
    return v !== null && typeof v === 'object' && !Array.isArray(v);
}

// The position of x in list, or -1: for the preloaded objects' arrays (perimeter_identity,
// perimeter_rules), whose elements are read by index (njs 0.9: `indexOf` is undefined on them).
function indexIn(list, x) {
    var i;
    for (i = 0; i < list.length; i++) {
        if (list[i] === x) {
            return i;
        }
    }
    return -1;
}

// A preloaded array as a plain one (for JSON.stringify and the array methods njs 0.9 lacks on them).
function copied(list) {
    var out = [];
    var i;
    for (i = 0; i < list.length; i++) {
        out.push(list[i]);
    }
    return out;
}

// The value at a name or a dotted path (scanner/plan/vllm_json.py at: 'sampling_params.n', through
// object members only); undefined when a member on the way is absent or not an object.
function valueAt(obj, path) {
    var names, i;
    if (path.indexOf('.') < 0) {
        return has(obj, path) ? obj[path] : undefined;
    }
    names = path.split('.');
    for (i = 0; i < names.length; i++) {
        if (!isObject(obj) || !has(obj, names[i])) {
            return undefined;
        }
        obj = obj[names[i]];
    }
    return obj;
}

// The object a dotted path's last member is in (obj itself for a name); null: not an object.
function parentAt(obj, path) {
    var dot = path.lastIndexOf('.');
    var p = dot < 0 ? obj : valueAt(obj, path.substring(0, dot));
    return isObject(p) ? p : null;
}

function lastName(path) {
    return path.substring(path.lastIndexOf('.') + 1);
}

// How many items a field holds (scanner/policy/model.py count_of).
function countOf(v) {
    if (v === null) {
        return 0;
    }
    if (Array.isArray(v)) {
        return v.length;
    }
    return typeof v === 'object' ? Object.keys(v).length : 1;
}

// Media items (scanner/policy/media.py items, the reference): every media key (perimeter_rules.media:
// key -> its kind) at any depth with a value other than null; an item is [kind, text].
var CANONICAL = /^https?:\/\/([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)(?::([0-9]{1,5}))?(?:[\/?#][\x21-\x5b\x5d-\x7e]*)?$/i;

function mediaItems(value, out) {
    var keys, i, v;
    if (Array.isArray(value)) {
        for (i = 0; i < value.length; i++) {
            mediaItems(value[i], out);
        }
        return;
    }
    if (value === null || typeof value !== 'object') {
        return;
    }
    keys = Object.keys(value);
    for (i = 0; i < keys.length; i++) {
        v = value[keys[i]];
        if (v !== null && has(perimeter_rules.media, keys[i])) {
            mediaItem(perimeter_rules.media[keys[i]], v, out);
        }
        mediaItems(v, out);
    }
}

// The items of one media key's value, by its kind (media.py _item).
function mediaItem(kind, v, out) {
    var obj = isObject(v);
    var j, x;
    if (kind === 'list') {
        for (j = 0; Array.isArray(v) && j < v.length; j++) {
            if (typeof v[j] === 'string') {
                out.push(['url', v[j]]);
            }
        }
    } else if (kind === 'source') {
        if (obj && typeof v.url === 'string') {
            out.push(['url', v.url]);
        } else if (obj && typeof v.data === 'string') {
            out.push(['data', v.data]);
        }
    } else if (kind === 'embeds') {
        out.push(['embeds', '']);
    } else {                            // url (the value or its url), input_audio (its data), file_data
        x = kind === 'url' ? (obj ? v.url : v) : (kind === 'input_audio' ? (obj ? v.data : undefined) : v);
        out.push(typeof x === 'string' ? [kind === 'url' ? 'url' : 'data', x] : ['other', '']);
    }
}

// hosts: the media step's domains as [name, port, the suffix a "*." name matches or false], split
// once by the generator (nginx_model.rules_json; media.py host_listed's partition)
function hostListed(host, port, hosts) {
    var i, h;
    for (i = 0; i < hosts.length; i++) {
        h = hosts[i];
        if (h[1] === port && (h[0] === host || (h[2] !== false && host.length > h[2].length &&
                                               host.substring(host.length - h[2].length) === h[2]))) {
            return true;
        }
    }
    return false;
}

function dataReason(data, limit) {
    return (limit !== null && data.length > limit) ? 'media-data:over-' + limit : '';
}

function urlReason(url, m) {
    var c;
    if (url.substring(0, 5).toLowerCase() === 'data:') {
        return dataReason(url, m.data);
    }
    if (m.urls === 'pass') {
        return '';
    }
    if (m.urls === 'deny') {
        return 'media-url:denied';
    }
    if (url.substring(0, 7).toLowerCase() !== 'http://' && url.substring(0, 8).toLowerCase() !== 'https://') {
        return 'media-url:scheme';
    }
    if (m.domains.length === 0) {
        return '';
    }
    c = CANONICAL.exec(url);
    if (c === null) {
        return 'media-url:not-canonical';
    }
    return hostListed(c[1].toLowerCase(), c[2] || '', m.hosts) ? '' : 'media-url:host';
}

// The admitted envelope's counts (scanner/plan/envelope.py count, pairs).
function itemCount(v, rule) {
    var i, k;
    if (v === null || v === undefined) {
        return 0;
    }
    if (!Array.isArray(v)) {
        return 1;
    }
    if (rule === 'each') {
        return v.length;
    }
    k = 0;
    for (i = 0; i < v.length; i++) {
        if (typeof v[i] === 'string' || Array.isArray(v[i])) {
            k++;
        }
    }
    return Math.max(1, k);
}

function pairCount(a, b) {
    if (a === 0 || b === 0) {
        return 0;
    }
    return (a !== b && a > 1 && b > 1) ? a * b : Math.max(a, b);
}

function whole(v) {
    var n = vllmInt(v);
    return (n === n && n > 0) ? n : 0;
}

// Token budgets: one bucket per key as the fleet's limiter keeps it (scanner/limiter/scripts.py
// BUCKET, the reference: N / 60000 a ms up to C). The shared dict has no compare-and-set and
// several workers use it: a key's two numbers are read and written under a per-key lock (dict.add
// of KEY:l fails while another worker holds it; it expires after TOKEN_LOCK_MS should its holder
// die). Entries expire 120 s after their last write: a bucket unseen that long is full anyway.
var TOKEN_LOCK_MS = 1000;
var TOKEN_LOCK_TRIES = 100000;

// Runs f(level, now) with `key`'s bucket locked and stores the level it returns (null: nothing
// stored); returns f's answer as [level, result]. Throws when the dict is full or the lock stays
// taken (a worker died holding it: refused until it expires).
function withBucket(key, limit, cap, f) {
    var dict = ngx.shared.perimeter_tokens;
    var lock = key + ':l';
    var i, now, seen, level, out;
    for (i = 0; !dict.add(lock, 1, TOKEN_LOCK_MS); i++) {
        if (i >= TOKEN_LOCK_TRIES) {
            throw new Error('token bucket ' + key + ' locked');
        }
    }
    try {
        now = Date.now();
        level = dict.get(key + ':v');
        seen = dict.get(key + ':t');
        level = typeof level === 'number' && typeof seen === 'number'
            ? Math.min(cap, level + Math.max(0, now - seen) * limit / 60000) : cap;
        out = f(level, now);
        if (out[0] !== null) {          // the time first: a failed second write only loses refill
            dict.set(key + ':t', now);
            dict.set(key + ':v', out[0]);
        }
        return out;
    } finally {
        dict.delete(lock);
    }
}

// The request's token zone, its bucket's numbers in perimeter_rules.tokens (limit a minute, cap,
// by); '' none. A fleet's replica deciding alone (on_unavailable: local): its share of the budget.
function tokenName(v) {
    return v.perimeter_fallback === '1' ? v.perimeter_local_tokens : v.perimeter_tokens;
}

// Charge the request's cost to its bucket: true, admitted; false, answered (429 with Retry-After,
// the seconds until the bucket holds the cost: 60 for a cost over the capacity; 503 the dict full).
function chargeTokens(r, v, tokens) {
    var name = tokenName(v);
    var z, who, cost, key, out;
    if (!name) {
        return true;
    }
    z = perimeter_rules.tokens[name];
    who = z.by === 'principal' ? v.perimeter_principal
        : (z.by === 'token' ? v.perimeter_jwt_principal : r.remoteAddress);
    // over the capacity never fits: counted as cap + 1 (a finite, exact amount)
    cost = Math.min(Math.max(1, tokens), z.cap + 1);
    v.perimeter_charged = String(cost);
    key = name + ':' + who;
    try {
        out = withBucket(key, z.limit, z.cap, function (level) {
            if (cost <= level) {
                return [level - cost, 0];
            }
            return [null, cost > z.cap ? 60 : Math.max(1, Math.ceil((cost - level) * 60 / z.limit))];
        });
    } catch (e) {                       // the dict is full (or the bucket stays locked): fail closed
        r.error('perimeter_tokens: ' + e);
        deny(r, 'token-budget-store-full', 503);
        return false;
    }
    if (out[1] > 0) {
        v.perimeter_retry_after = String(out[1]);
        r.internalRedirect('@perimeter_token_budget');
        return false;
    }
    // what the answer settles (settle, js_body_filter): the bucket's key, the refundable charge
    v.perimeter_settle = key + ' ' + cost + ' -';
    return true;
}

// The fleet's limiter (policy shared:; scanner/limiter/http_api.py): $perimeter_shared names the
// route's zones in perimeter_rules.shared. A refusal is 429 with the limiter's reason; no answer
// (the limiter or its store down, a call it cannot read): 503 shared-store-unavailable. Never
// admitted without the limiter's word.
function sharedOf(r, v) {
    var e = v.perimeter_shared && has(perimeter_rules.shared, v.perimeter_shared)
        ? perimeter_rules.shared[v.perimeter_shared] : null;
    if (e === null) {
        return null;
    }
    // the principal a key or a token named ($perimeter_who), or the client address
    return {key: e.by === 'p' ? v.perimeter_who : r.remoteAddress, zones: copied(e.zones), conc: copied(e.conc),
            tokens: e.tokens};
}

function limiterCall(v, path, call) {
    return ngx.fetch(v.perimeter_limiter + path, {method: 'POST', body: JSON.stringify(call),
                                                  headers: {'Content-Type': 'application/json'}});
}

// This NGINX instance as the limiter knows it (njs >= 0.8): one id for all its workers, in the
// shared dict perimeter_replica, made by the first that asks (a restarted NGINX has a new one).
// The limiter renews the slots an acquire naming it took while it is heard from (heartbeat), so
// the slots of an NGINX killed mid-stream come back within seconds (scanner/limiter/store.py
// Owners). null without the dict (njs 0.7): slots are then renewed until the zone's slot_ttl_s.
function replicaId() {
    var d = typeof ngx.shared === 'object' ? ngx.shared.perimeter_replica : undefined;
    var id;
    if (!d) {
        return null;
    }
    id = d.get('id');
    if (id === undefined) {
        d.add('id', Date.now().toString(36) + '-' + Math.random().toString(36).slice(2, 12));
        id = d.get('id');
    }
    return typeof id === 'string' && id ? id : null;
}

// js_periodic (njs >= 0.8.1, every scanner/limiter/config.py HEARTBEAT_S): this replica is alive.
function heartbeat(s) {
    var id = replicaId();
    if (id === null) {
        return;
    }
    return limiterCall(s.variables, '/v1/alive', {replica: id}).then(function () {}, function (e) {
        ngx.log(ngx.WARN, 'perimeter limiter heartbeat: ' + e);
    });
}

// Resolves true (admitted: $perimeter_held) or false (answered). cost: the token cost (null: the
// route has no token zone).
function acquire(r, v, cost) {
    var s = sharedOf(r, v);
    var call, replica;
    if (s === null || v.perimeter_held === '1') {
        return Promise.resolve(true);
    }
    v.perimeter_slot = v.request_id;
    call = {key: s.key, zones: s.zones, slot: v.perimeter_slot};
    if (cost !== null) {
        call.cost = cost;
    }
    replica = replicaId();
    if (replica !== null) {
        call.replica = replica;         // the slot is this replica's: renewed while it lives
    }
    return limiterCall(v, '/v1/acquire', call).then(function (reply) {
        return reply.status === 200 || reply.status === 503 ? reply.json() : null;
    }).then(null, function (e) {
        r.error('perimeter limiter: ' + e);
        return null;
    }).then(function (a) {
        var down = a === null || typeof a !== 'object' || typeof a.allow !== 'boolean';
        if (down || (!a.allow && a.reason === 'shared-store-unavailable')) {
            // on_unavailable: local: this proxy's share decides when the limiter says so (its
            // store down long enough: "local": true) or does not answer at all
{% if w.failover_at_once %}
            if (v.perimeter_local_up && (down || a.reason === 'shared-store-unavailable')) {
{% else %}
            if (v.perimeter_local_up && (down || a.local === true)) {
{% endif %}
                v.perimeter_fallback = '1';
                r.internalRedirect(v.perimeter_local_up);
                return false;
            }
            deny(r, 'shared-store-unavailable', 'shared_503');
            return false;
        }
        if (!a.allow) {
            v.perimeter_shared_retry = String(Math.max(1, Math.floor(Number(a.retry_after)) || 1));
            deny(r, /^[a-z-]{1,40}$/.test(a.reason) ? a.reason : 'rate', 'shared_429');
            return false;
        }
        v.perimeter_held = '1';
        return true;
    });
}

// js_content of a limited route without a full body check: the limiter first, then on to the
// route's named location ($perimeter_up: its body fast path, or the proxying location).
function limit(r) {
    var v = r.variables;
    v.perimeter_onward = 'up';
    return acquire(r, v, null).then(function (ok) {
        if (ok) {
            r.internalRedirect(v.perimeter_up);
        }
    }).then(null, function (e) {
        r.error('perimeter limiter: ' + e);
        deny(r, 'shared-store-unavailable', 'shared_503');
    });
}

// js_content of the local share's location (on_unavailable: local, the limiter undecided): its
// limit_req / limit_conn passed; on to what the limiter would have let the request go on to.
function onward(r) {
    var v = r.variables;
    if (v.perimeter_onward === 'direct') {
        return direct(r);             // the exact check again, its tokens charged to the local share
    }
    r.internalRedirect(v.perimeter_up);
}

// post_action: a held slot released, an unused reservation ($perimeter_refund) given back. The
// answer was sent already; the status it had is kept (the access log's).
function after(r) {
    var status = r.status || 200;
    var v = r.variables;
    var s = sharedOf(r, v);
    var calls = [];
    var refund, call;
    if (s === null || v.perimeter_held !== '1') {
        r.return(status);
        return;
    }
    refund = Math.floor(Number(v.perimeter_refund || '0')) || 0;
    // one call: the slots released, with the refund settled in the same call when there is one
{% if w.slots_kept %}
    if (s.conc.length < 0) {
{% else %}
    if (s.conc.length) {
{% endif %}
        call = {key: s.key, zones: s.conc, slot: v.perimeter_slot};
        if (s.tokens && refund > 0) {
            call.settle = s.tokens;
            call.refund = refund;
        }
        calls.push(limiterCall(v, '/v1/release', call));
    } else if (s.tokens && refund > 0) {
        calls.push(limiterCall(v, '/v1/settle', {key: s.key, zone: s.tokens, refund: refund}));
    }
    return Promise.all(calls).then(function () { r.return(status); }, function (e) {
        r.error('perimeter limiter: ' + e);    // the slot expires, the charge stands
        r.return(status);
    });
}

// Admission of a checked body: the token charge (local, chargeTokens) or the limiter (every zone
// of the route, with the cost), then `then`. Returns the limiter's promise, if it was asked.
function admit(r, v, tokens, then) {
    var cost;
    if (!v.perimeter_shared || v.perimeter_fallback === '1') {
        if (chargeTokens(r, v, tokens)) {
            then();
        }
        return null;
    }
    cost = null;
    if (v.perimeter_tokens) {
        cost = Math.max(1, tokens);
        v.perimeter_charged = String(cost);
        v.perimeter_settle = perimeter_rules.shared[v.perimeter_shared].tokens + ' ' + cost + ' -';
    }
    v.perimeter_onward = 'direct';
    return acquire(r, v, cost).then(function (ok) {
        if (ok) {
            then();
        }
    });
}

// Settlement (scanner/plan/settle.py, the reference): the unused part of the charge goes back
// once the answer reports its usage. A body running sequences vLLM's usage does not count
// (best_of over n): nothing refundable.
function unreported(obj) {
    var best, n;
    if (obj === null || !has(obj, 'best_of') || obj.best_of === null) {
        return false;
    }
    best = vllmInt(obj.best_of);
    n = vllmInt(has(obj, 'n') && obj.n !== null ? obj.n : 1);
    return best !== best || n !== n || best > n;
}

// settle.vllm_true and settle.asking_usage (askUsage true: stream_options written).
function vllmTrue(v) {
    if (typeof v === 'boolean') {
        return v;
    }
    if (typeof v === 'number') {
        return v === 1;
    }
    return typeof v === 'string' && has(perimeter_rules.true_text, v.toLowerCase());
}

function askUsage(obj) {
    var options = has(obj, 'stream_options') ? obj.stream_options : null;
    var kept = {};
    var keys, i;
    if (obj.stream !== true) {
        return false;
    }
    if (options !== null && (!isObject(options) || vllmTrue(options.include_usage))) {
        return false;
    }
    keys = options === null ? [] : Object.keys(options);
    for (i = 0; i < keys.length; i++) {
        if (keys[i] !== 'include_usage' && keys[i] !== 'continuous_usage_stats') {
            kept[keys[i]] = options[keys[i]];
        }
    }
    kept.include_usage = true;
    obj.stream_options = kept;
    return true;
}

// settle.usage_of: [input, output] of a JSON answer or one event's data; null when none.
function countOf0(value) {
    return (typeof value === 'number' && Math.floor(value) === value && value >= 0) ? value : -1;
}

function usageOf(doc) {
    var u, input, output;
    if (!isObject(doc)) {
        return null;
    }
    u = doc.usage;
    if (!isObject(u) && isObject(doc.response)) {
        u = doc.response.usage;
    }
    if (!isObject(u)) {
        return null;
    }
    input = countOf0(has(u, 'prompt_tokens') ? u.prompt_tokens : u.input_tokens);
    output = countOf0(has(u, 'completion_tokens') ? u.completion_tokens
                      : (has(u, 'output_tokens') ? u.output_tokens : 0));
    return (input < 0 || output < 0) ? null : [input, output];
}

// settle.hidden: the usage-only event vLLM sends last when asked ("choices": [] and a usage).
function hiddenEvent(doc) {
    return isObject(doc) && Array.isArray(doc.choices) && doc.choices.length === 0 && isObject(doc.usage);
}

// settle.final: an event after which the usage cannot change (the usage-only event, or a Responses
// API ending event carrying response.usage): the stream is settled as soon as it passes.
function finalEvent(doc) {
    return hiddenEvent(doc) || (isObject(doc) && typeof doc.type === 'string' &&
        has(perimeter_rules.final_types, doc.type) && isObject(doc.response) && usageOf(doc) !== null);
}

// The refund goes back into the bucket the charge was taken from (`key`), up to its capacity (as
// scanner/limiter/scripts.py gives it back); a failure (the dict full) keeps the charge.
function giveBack(r, key, n) {
    var name = tokenName(r.variables);
    var z = name ? perimeter_rules.tokens[name] : null;
    if (n <= 0 || !z || !(z.limit > 0) || !(z.cap > 0)) {
        return;
    }
    try {
        withBucket(key, z.limit, z.cap, function (level) {
            return [Math.min(z.cap, level + n), 0];
        });
    } catch (e) {
        r.error('perimeter_tokens: ' + e);
    }
}

// Per request (each request has its own VM): what settleHeaders decided for this answer. A JSON
// answer is read up to perimeter_rules.answer_max bytes, a stream's line up to .answer_line_max
// (scanner/rules.py ANSWER_MAX, ANSWER_LINE_MAX): past either the charge stands, ids are not sent.
var answer = null;

// js_header_filter on token-budget locations: read $perimeter_settle ("KEY COST FLAGS", FLAGS a:
// the proxy asked for the usage); an encoded answer (the proxy asks for identity) is not read.
function settleHeaders(r) {
    var spec = r.variables.perimeter_settle || '';
    var enc = r.headersOut['Content-Encoding'];
    var type = r.headersOut['Content-Type'] || '';
    var b = spec.lastIndexOf(' ');
    var a = spec.lastIndexOf(' ', b - 1);
    var encoded = enc && enc !== 'identity';
    var settled = spec !== '' && a >= 0 && !encoded;
    var own = null;
    var secret;
    answer = null;
    if (r.variables.perimeter_seal === '1') {
        delete r.headersOut['Content-Length'];   // sealed ids are longer: the length changes
        secret = encoded ? null : ownerSecret(r);
        if (secret === null) {                   // ids that cannot be sealed never leave
            r.error('perimeter: an answer carrying response ids cannot be sealed: not sent');
            answer = {drop: true};
            return;
        }
        own = {secret: secret, principal: r.variables.perimeter_who || ''};
    }
    if (!settled && own === null) {
        return;
    }
    answer = {key: settled ? spec.substring(0, a) : '', cost: settled ? Number(spec.substring(a + 1, b)) : 0,
              asked: settled && spec.substring(b + 1) === 'a', settled: settled, own: own, drop: false,
              stream: /^\s*text\/event-stream/i.test(type),
              parts: [], size: 0, held: null, skip: false, usage: null, final: false, done: false,
              broken: false};
    if (answer.stream && answer.asked) {
        delete r.headersOut['Content-Length'];   // an event may be dropped: the length changes
    }
}

// One complete line of a stream (no '\n'): its usage noted; false: dropped (the usage-only event
// the proxy asked for, and the blank line ending it).
function streamLine(s, line) {
    var text = line.charAt(line.length - 1) === '\r' ? line.substring(0, line.length - 1) : line;
    var doc;
    if (s.skip) {
        s.skip = false;
        if (text === '') {
            return false;
        }
    }
    if (text.substring(0, 5) !== 'data:' || text.indexOf('usage') < 0) {
        return true;
    }
    try {
        doc = JSON.parse(text.substring(text.charAt(5) === ' ' ? 6 : 5));
    } catch (e) {
        return true;
    }
    s.usage = usageOf(doc) || s.usage;
    if (s.usage !== null && finalEvent(doc)) {
        s.final = true;                 // settled before this event leaves (settle)
    }
    if (s.asked && hiddenEvent(doc)) {
        s.skip = true;
        return false;
    }
    return true;
}

// A stream: complete lines go on at once (the usage-only event dropped when the proxy asked);
// only an incomplete trailing line waits for its end. Nothing is held back when nothing is
// dropped. Returns what to send on.
function streamPart(s, data, last) {
    var buf, end, lines, out, i, tail;
    if (s.broken) {                     // a line over answer_line_max went by: the rest unread
        return s.own === null ? data : '';
    }
    buf = s.held ? Buffer.concat([s.held, data]) : data;
    end = buf.lastIndexOf('\n');
    s.held = null;
    if (buf.length - end - 1 > perimeter_rules.answer_line_max) {   // not read: the charge stands
        s.broken = true;
        tail = buf.slice(end + 1);
        buf = buf.slice(0, end + 1);
        last = false;
    } else if (!last && end + 1 < buf.length) {
        s.held = buf.slice(end + 1);
    }
    lines = end < 0 ? [] : buf.slice(0, end + 1).toString().split('\n');
    lines.pop();
    if (last && end + 1 < buf.length) {
        lines.push(buf.slice(end + 1).toString());
    }
    out = [];
    for (i = 0; i < lines.length; i++) {
        if (streamLine(s, lines[i])) {
            out.push(s.own === null ? lines[i] : sealLine(lines[i], s.own));
        }
    }
    if (s.broken) {
        if (!s.final) {
            s.usage = null;
        }
        if (s.own === null) {           // the long line goes on as it came
            return s.asked ? Buffer.concat([Buffer.from(out.length ? out.join('\n') + '\n' : ''), tail]) : data;
        }
        ngx.log(ngx.ERR, 'perimeter: a stream line over ' + perimeter_rules.answer_line_max +
                ' bytes: the rest not sent');
    }
    if (!s.asked && s.own === null) {   // nothing is dropped or sealed: the bytes as they came
        return data;
    }
    return out.length ? out.join('\n') + (last && end + 1 < buf.length ? '' : '\n') : '';
}

// The charge less the usage returned (settle.refund), once per answer: to the limiter's reservation
// ($perimeter_refund, post_action settles it) or to the bucket of the charge (giveBack). Usage
// noted in $perimeter_usage ("INPUT+OUTPUT") for the access log.
function settleOnce(r, s) {
    if (s.done || s.usage === null || !s.settled) {
        return;
    }
    s.done = true;
    r.variables.perimeter_usage = s.usage[0] + '+' + s.usage[1];
    if (r.variables.perimeter_shared && r.variables.perimeter_fallback !== '1') {
        r.variables.perimeter_refund = String(Math.max(0, s.cost - s.usage[0] - s.usage[1]));
    } else {
        giveBack(r, s.key, s.cost - s.usage[0] - s.usage[1]);
    }
}

// js_body_filter on token-budget locations: the bytes pass on at once (a stream's usage-only event
// excepted when the proxy asked) and the charge is settled before the bytes completing the usage
// leave: a stream once its final usage event passed (settle.final: before [DONE], at which a client
// such as the openai SDK closes the connection), a JSON answer once complete. No usage: it stands.
function settle(r, data, flags) {
    var s = answer;
    var out = data;
    var doc, text;
    if (s === null) {
        r.sendBuffer(data, flags);
        r.done();
        return;
    }
    if (s.drop) {                       // response ids that cannot be sealed: nothing is sent
        if (flags.last) {
            r.sendBuffer('', flags);
        }
        return;
    }
    if (s.stream) {
        out = streamPart(s, data, flags.last);
    } else {
        if (s.size + data.length <= perimeter_rules.answer_max) {
            s.parts.push(data);
        }
        s.size += data.length;
        if (s.own !== null) {           // a sealed answer leaves whole, once it is complete
            out = '';
        }
        if (flags.last && s.size <= perimeter_rules.answer_max) {
            text = Buffer.concat(s.parts).toString();
            try {
                doc = JSON.parse(text);
            } catch (e) {
                doc = null;
            }
            s.usage = usageOf(doc);
            if (s.own !== null) {
                out = sealText(text, s.own);
            }
        } else if (flags.last && s.own !== null) {
            r.error('perimeter: an answer carrying response ids over ' + perimeter_rules.answer_max +
                    ' bytes: not sent');
        }
    }
    if (s.final || flags.last) {
        settleOnce(r, s);
    }
    if (flags.last) {
        answer = null;
    }
    r.sendBuffer(out, flags);
}

// --- the rule program (scanner/plan/program.py; scanner/plan/interpret.py is the reference) ----
// perimeter_rules.checks ($perimeter_check -> program id), .programs (lists of steps). Each op is
// (step, s) -> reason ('' passes) over the run's state s (exact); the first reason refuses the body.
var PLAIN = /^[A-Za-z0-9_]{1,64}$/;

function nothing(value) {
    return value === undefined || value === null;
}

var OPS = {
    cap: function (p, s) {
        var value = valueAt(s.doc, p.path);
        var n;
        if (nothing(value)) {
            return '';
        }
        n = vllmInt(value);
        // not an integer vLLM reads (NaN), or over: one reason, the reference's
        return n !== n || n > p.max ? 'json-cap:' + p.path : '';
    },
    keys: function (p, s) {
        var keys = Object.keys(s.doc);
        var i, key, mode;
        for (i = 0; i < keys.length; i++) {
            key = keys[i];
            mode = has(p.modes, key) ? p.modes[key] : (p.unknown === 'pass' ? 'allow' : p.unknown);
            if (mode === 'reject') {
                return has(p.modes, key) ? 'forbidden-field:' + key
                    : 'unknown-field:' + (PLAIN.test(key) ? key : 'not-a-plain-name');
            }
            if (mode === 'strip') {
                s.strip.push(key);
                delete s.doc[key];
                s.changed = true;
            }
        }
        return '';
    },
    count: function (p, s) {
        return countOf(has(s.doc, p.field) ? s.doc[p.field] : null) > p.max
            ? 'json-cap:' + p.field + ':count-over-' + p.max : '';
    },
    values: function (p, s) {           // JSON equality: the type too (1 is not "1" nor true)
        var value = has(s.doc, p.field) ? s.doc[p.field] : null;
        var i;
        for (i = 0; value !== null && i < p.values.length; i++) {
            if (typeof value === typeof p.values[i] && value === p.values[i]) {
                return '';
            }
        }
        return value === null ? '' : 'json-cap:' + p.field + ':not-listed';
    },
    media: function (p, s) {
        var items = [];
        var i, why;
        if ((s.seen === null ? (s.v.perimeter_media_key === '0' ? '0' : '') : s.seen) === '0') {
            return '';                  // NGINX's regex found no media key (in any spelling)
        }
        mediaItems(s.doc, items);
        for (i = 0; i < items.length; i++) {
            if (items[i][0] === 'url') {
                why = urlReason(items[i][1], p);
            } else if (items[i][0] === 'data') {
                why = dataReason(items[i][1], p.data);
            } else {
                why = (items[i][0] === 'embeds' && p.embeds === 'deny') ? 'media-embeds' : '';
            }
            if (why) {
                return why;
            }
        }
        return (p.items !== null && items.length > p.items) ? 'media-items:over-' + p.items : '';
    },
    budget: function (p, s) {
        var i, value, fit, parent;
        for (i = 0; i < p.fields.length; i++) {
            value = valueAt(s.doc, p.fields[i]);
            if (!nothing(value)) {
                s.from = 'sent';
                s.budget = whole(value);
                return '';
            }
        }
        s.from = 'default';
        s.budget = p.cap;
        if (p.absent === 'reject') {
            return 'json-cap:' + p.field + ':absent';
        }
        fit = p.cap ? (p.window ? Math.min(p.cap, p.window - s.size) : p.cap) : 0;
        parent = parentAt(s.doc, p.field);   // a dotted field: written only into an object there
        if (fit < 1 || parent === null) {
            return '';                       // vLLM's own default (or it refuses the body as sent)
        }
        for (i = 0; i < p.fields.length; i++) {
            if (parentAt(s.doc, p.fields[i]) === parent) {
                delete parent[lastName(p.fields[i])];
            }
        }
        parent[lastName(p.field)] = fit;
        s.wrote.push([parent, lastName(p.field)]);
        s.from = 'written';
        s.budget = s.written = fit;
        s.changed = true;
        return '';
    },
    salt: function (p, s) {
        var salt = s.v.perimeter_salt || '';   // the route's principal's or audience's
        if (!salt) {
            return 'bad-request:no-salt';       // none known: refused, never unsalted
        }
        s.doc.cache_salt = salt;
        s.changed = true;
        return '';
    },
    pin: function (p, s) {
        s.doc[p.field] = p.value;
        s.wrote.push([s.doc, p.field]);
        s.changed = true;
        return '';
    },
    envelope: function (p, s) {
        var doc = s.doc;
        var items = 0;
        var per = 1;
        var i, f, value;
        for (i = 0; i < p.items.length; i++) {
            f = p.items[i][0];
            items += has(doc, f) ? itemCount(doc[f], p.items[i][1]) : 0;
        }
        for (i = 0; i < p.pairs.length; i++) {
            items += pairCount(has(doc, p.pairs[i][0]) ? itemCount(doc[p.pairs[i][0]], 'each') : 0,
                               has(doc, p.pairs[i][1]) ? itemCount(doc[p.pairs[i][1]], 'each') : 0);
        }
        for (i = 0; i < p.per.length; i++) {
            value = valueAt(doc, p.per[i]);
            per = nothing(value) ? per : Math.max(per, whole(value));
        }
        s.env = true;
        s.seq = Math.max(1, items) * per;
        s.out = p.out.length ? p.rest : 0;
        for (i = 0; i < p.out.length; i++) {
            value = valueAt(doc, p.out[i]);
            if (!nothing(value)) {
                s.out = whole(value);
                break;
            }
        }
        s.tokens = s.seq * s.out + s.size;
        if (p.max_sequences !== null && s.seq > p.max_sequences) {
            return 'envelope-sequences:over-' + p.max_sequences;
        }
        return (p.max_tokens !== null && s.tokens > p.max_tokens) ? 'envelope-tokens:over-' + p.max_tokens : '';
    },
    owned: function (p, s) {
        var secret = ownerSecret(s.r);
        var i, name, rid;
        for (i = 0; i < p.fields.length; i++) {
            name = p.fields[i];
            if (!has(s.doc, name) || s.doc[name] === null || s.strip.indexOf(name) >= 0) {
                continue;
            }
            rid = unseal(secret, s.v.perimeter_who || '', s.doc[name]);
            if (rid === null) {
                return 'not-owner:' + name;
            }
            s.doc[name] = rid;          // vLLM's own id
            s.changed = true;
        }
        return '';
    },
    ask_usage: function (p, s) {
        if (askUsage(s.doc)) {
            s.asked = s.changed = true;
        }
        return '';
    }
};

function run(steps, s) {
    var i, why;
    for (i = 0; i < steps.length; i++) {
        why = OPS[steps[i].op](steps[i], s);
        if (why) {
            return why;
        }
    }
    return '';
}

// The check's program; none (a config and its rules out of step): the check fails, closed.
function programOf(v) {
    var rules = perimeter_rules;
    var id = has(rules.checks, v.perimeter_check) ? rules.checks[v.perimeter_check] : '';
    if (!has(rules.programs, id)) {
        throw new Error('no rule program for check ' + v.perimeter_check);
    }
    return rules.programs[id];
}

// A body that is not valid UTF-8 (Python's json, and so the reference and vLLM, refuse it):
// requestText holds one U+FFFD per invalid sequence, so more of them than the body's own bytes
// EF BF BD spell. njs before 0.8 (NGINX 1.22's 0.7) gives such a body as a byte string instead,
// which its String.prototype.fromUTF8 (gone in 0.8) reads as null.
var REPLACEMENT = Buffer.from([0xef, 0xbf, 0xbd]);
function invalidUtf8(text, buf) {
    var i = text.indexOf('\ufffd');
    var inText = 0;
    var inBuf = 0;
    if (typeof text.fromUTF8 === 'function' && text.fromUTF8() === null) {
        return true;
    }
    while (i !== -1) {
        inText++;
        i = text.indexOf('\ufffd', i + 1);
    }
    if (inText === 0) {
        return false;
    }
    i = buf ? buf.indexOf(REPLACEMENT) : -1;
    while (i !== -1) {
        inBuf++;
        i = buf.indexOf(REPLACEMENT, i + 3);
    }
    return inText > inBuf;
}

// More than most brackets opening in the text (in strings too)? If not, it is within most.
function manyBrackets(text, most) {
    var i, n = 0;
    for (i = text.indexOf('['); i !== -1 && n <= most; i = text.indexOf('[', i + 1)) {
        n++;
    }
    for (i = text.indexOf('{'); i !== -1 && n <= most; i = text.indexOf('{', i + 1)) {
        n++;
    }
    return n > most;
}

// Nesting (scanner/plan/body.py nesting, the reference): is the text nested deeper than most
// (brackets open at once outside strings, whether or not it is valid JSON)?
function deeper(text, most) {
    var i, c, depth = 0, quoted = false;
    if (!manyBrackets(text, most)) {
        return false;
    }
    for (i = 0; i < text.length; i++) {
        c = text.charCodeAt(i);
        if (quoted) {
            if (c === 92) {
                i++;
            } else if (c === 34) {
                quoted = false;
            }
        } else if (c === 34) {
            quoted = true;
        } else if (c === 91 || c === 123) {
            depth++;
            if (depth > most) {
                return true;
            }
        } else if (c === 93 || c === 125) {
            depth--;
        }
    }
    return false;
}

// A number njs's JSON.parse read where Python's json (the reference, vLLM) refuses the body: a
// leading zero (010, -01), no integer part (.5) or no fraction digits (1., 1.e5), a plus sign (+1,
// +Infinity, njs 0.9), -Infinity (njs 0.9), measured on njs 0.7.9 and 0.9.9. Asked when NGINX's
// $perimeter_plain found such a token in a value's place, strings not skipped
// (nginx_regex.NUMBER_LENIENT), and of a body that is one number; here the pattern counts only
// outside strings: the quotes before a candidate are walked once (a regex that skips strings with
// a group per escape costs 0.5 s, or throws, on a string of 500,000 escapes).
var LENIENT_AT = /(?:^|[:,\[])\s*(?:\+|-I|-?(?:0[0-9]|\.|[0-9]+\.(?![0-9])))/g;
function lenientNumber(text) {
    var inside = false;
    var q = text.indexOf('"');
    var m, k;
    LENIENT_AT.lastIndex = 0;
    while ((m = LENIENT_AT.exec(text)) !== null) {
        for (; q !== -1 && q < m.index; q = text.indexOf('"', q + 1)) {
            for (k = q; inside && text.charCodeAt(k - 1) === 92; k--) {
            }
            if ((q - k) % 2 === 0) {    // opens a string, or closes it (an even run of backslashes)
                inside = !inside;
            }
        }
        if (!inside) {
            return true;
        }
    }
    return false;
}

// A \u escape of a lone surrogate in a text JSON.parse read (every backslash starts an escape):
// a high one not followed at once by a low one, or a low one alone. JSON.parse reads it as U+FFFD,
// Python's json as the surrogate itself, so two names that are two to vLLM were one here; the
// reference refuses such a body (scanner/plan/body.py document), and so does njs.
var SURROGATE_AT = /\\u[dD][89a-fA-F]/;
function loneSurrogate(text) {
    var k, cp;
    if (!SURROGATE_AT.test(text)) {
        return false;
    }
    for (k = text.indexOf('\\'); k !== -1; k = text.indexOf('\\', k)) {
        if (text.charCodeAt(k + 1) !== 117) {
            k += 2;
            continue;
        }
        cp = parseInt(text.substring(k + 2, k + 6), 16);
        k += 6;
        if (cp >= 0xdc00 && cp <= 0xdfff) {
            return true;
        }
        if (cp >= 0xd800 && cp <= 0xdbff) {
            cp = text.substring(k, k + 2) === '\\u' ? parseInt(text.substring(k + 2, k + 6), 16) : 0;
            if (!(cp >= 0xdc00 && cp <= 0xdfff)) {
                return true;
            }
            k += 6;
        }
    }
    return false;
}

// seen: the media decision ('': walk); null: NGINX's, $perimeter_media_key (perimeter.direct).
function exact(r, v, seen) {
    var text = r.requestText;
    var buf = r.requestBuffer;
    var nbytes = buf ? buf.length : 0;
    var obj, s, reason, plain;
    // a form body (multipart, urlencoded) is not JSON to vLLM: not inspected, as on the fast path
    if (text === undefined || text === '' || v.perimeter_form === '1') {
        return admit(r, v, nbytes, function () {
            r.internalRedirect(v.perimeter_up + '_checked');
        });
    }
    try {
        obj = JSON.parse(text);
    } catch (e) {
        obj = undefined;        // malformed, or deeper than JSON.parse reads (31 levels, measured)
    }
    // a body JSON.parse read is counted only when JSON.parse reads deeper than the plan's depth
    // (parse_depth, generated) and it has many brackets; neither that nor the UTF-8 check for a
    // body NGINX's $perimeter_plain found strict UTF-8 with few brackets (1), no UTF-8 check for
    // one it found strict UTF-8 with a lenient number's spelling (n: lenientNumber looks)
    plain = v.perimeter_plain;
    if ((obj === undefined || (plain !== '1' && perimeter_rules.parse_depth > perimeter_rules.depth
                               && manyBrackets(text, perimeter_rules.depth)))
        && deeper(text, perimeter_rules.depth)) {
        deny(r, 'bad-json:depth-over-' + perimeter_rules.depth);
        return;
    }
    if (obj === undefined || (plain !== '1' && plain !== 'n' && invalidUtf8(text, buf))
        || (plain === 'n' && lenientNumber(text)) || loneSurrogate(text)) {
        deny(r, 'bad-json');
        return;
    }
    if (!isObject(obj)) {
        deny(r, typeof obj === 'number' && lenientNumber(text) ? 'bad-json' : 'bad-json:not-an-object');
        return;
    }
    // the run's state (scanner/plan/interpret.py's): the working copy, the fields stripped, the
    // budget (from, budget, written), the envelope (env, seq, out, tokens), asked, changed, seen;
    // wrote: the [object, name] places the program wrote a value to (numbers: the pins, the budget)
    s = {doc: obj, size: nbytes, strip: [], written: null, env: false, seq: 1, out: 0, tokens: nbytes, from: '', budget: 0,
         asked: false, changed: false, seen: seen, r: r, v: v, text: text, wrote: []};
    reason = run(programOf(v), s);
    // the access log: the model, the sequences, the output budget and where it came from
    v.perimeter_model = typeof s.doc.model === 'string' ? s.doc.model.substring(0, 128) : '';
    v.perimeter_sequences = String(s.seq);
    v.perimeter_output = s.from ? String(s.env ? s.out : s.budget) : '';
    v.perimeter_output_from = s.from;
    if (reason) {
        deny(r, reason);
        return;
    }
    return admit(r, v, s.tokens, function () {
        forward(r, v, s);
    });
}

// The admitted body on its way: as sent, or as the program rewrote it (<up>_rewrite).
function forward(r, v, s) {
    if (v.perimeter_settle && unreported(s.doc)) {
        v.perimeter_settle = v.perimeter_settle.replace(/ [0-9]+ -$/, ' 0 -');
    }
    if (v.perimeter_settle && s.asked) {
        v.perimeter_settle = v.perimeter_settle.replace(/-$/, 'a');
    }
    if (s.changed) {
        v.perimeter_body_out = bodyText(s);
        r.internalRedirect(v.perimeter_up + '_rewrite');
        return;
    }
    r.internalRedirect(v.perimeter_up + '_checked');
}

// --- a rewritten body's numbers as the client sent them ---------------------------------------
// JSON.stringify writes each number as its double: 1e400 as null, 10**25 as 1e+25, 2**63-1 as
// 9223372036854776000, 1.0 as 1, -0.0 as 0, 1E+2 as 100, 0.10 as 0.1, where the reference (Python's
// json) and Lua forward the client's number. NUMBER_SPELLED matches a whole number token that may
// be so (-0, 16 digits or more, an exponent, a fraction ending in 0 or from .000000, 16 digits and
// dots), in strings too: a superset, held to JSON.stringify by tests/generate/test_nginx_numbers.py.
// (*SKIP) starts the next try after a digit run, not inside it. A rewritten body with none is
// written by JSON.stringify: one regex test, 2-4 us on a 4 KB chat, but about 15 ns a digit where
// digits are dense (measured: 6.5 KB of numbers in a message 80-100 us, 130 KB of token ids 1-1.3
// ms; JSON.parse of the latter 0.6-1.2 ms). Else
// keptNumbers: each such token whose text JSON.stringify would not give back becomes, in a copy of
// the text, a placeholder number (base + the index of its text; digits: a string it falls in stays a
// string); JSON.parse of the copy has the body's shape (a name given twice: the last value, as in
// the body's own parse); wherever the rewritten document still holds the client's number at a
// placeholder's place, and the program wrote no value there (s.wrote: the pins, the budget written
// in, written as JSON.stringify writes them), a placeholder string goes in, and in JSON.stringify's
// text the client's text replaces it. Not a JSON.parse reviver: njs (0.7.9 and 0.9.9, measured)
// calls it for an object's integer-like names first and once for a name given twice, so its calls
// do not follow the tokens' order. Anything unexpected (the copy unreadable, a placeholder seen
// twice): the document as JSON.stringify writes it, as before.
var NUMBER_SPELLED = /-0(?![.0-9eE])|-?[0-9]{16,}(?![.0-9eE])|-?[0-9]+(*SKIP)(?:(?:\.[0-9]+)?[eE][-+]?[0-9]+|\.[0-9]*0(?![0-9])|\.0{6}[0-9]*|\.(?>[0-9]+)(?<=[0-9.]{16}))/g;
var JSON_NUMBER = /^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?$/;
var PLACEHOLDER_BASE = 4503599627370496;    // 2**52: from it to 2**53 every integer is a double

function bodyText(s) {
    NUMBER_SPELLED.lastIndex = 0;
    return NUMBER_SPELLED.test(s.text) ? keptNumbers(s) : JSON.stringify(s.doc);
}

// The texts of the tokens JSON.stringify would not give back (texts, and index: text -> its
// index), and the body's text with each one base + its index (an exec loop: njs 0.7.9's replace
// with a function took 21 us on the 4 KB chat, this 13).
function spelled(text, base) {
    var found = {texts: [], index: {}, base: base};
    var parts = [];
    var at = 0;
    var m;
    NUMBER_SPELLED.lastIndex = 0;
    while ((m = NUMBER_SPELLED.exec(text)) !== null) {
        if (!JSON_NUMBER.test(m[0]) || JSON.stringify(Number(m[0])) === m[0]) {
            continue;
        }
        if (!has(found.index, m[0])) {
            found.index[m[0]] = found.texts.push(m[0]) - 1;
        }
        parts.push(text.substring(at, m.index), String(base + found.index[m[0]]));
        at = m.index + m[0].length;
    }
    parts.push(text.substring(at));
    found.copy = parts.join('');
    return found;
}

function wroteAt(wrote, obj, name) {
    var i;
    for (i = 0; i < wrote.length; i++) {
        if (wrote[i][0] === obj && wrote[i][1] === name) {
            return true;
        }
    }
    return false;
}

// Puts a placeholder string (marker + the text's index) into doc wherever the copy (shadow) holds
// a placeholder number and doc the number its text reads as, not written by the program; put:
// each [object, name, number] replaced. A name the copy spells otherwise (a number token in it)
// is looked up as the copy spells it.
function placed(doc, shadow, s, found, marker, put) {
    var names = Array.isArray(doc) ? null : Object.keys(doc);
    var n = names === null ? doc.length : names.length;
    var i, name, v, w, at;
    for (i = 0; i < n; i++) {
        name = names === null ? i : names[i];
        v = doc[name];
        if (v === null || (typeof v !== 'number' && typeof v !== 'object')
            || (names !== null && wroteAt(s.wrote, doc, name))) {
            continue;
        }
        w = names === null || has(shadow, name) ? shadow[name] : shadow[name.replace(NUMBER_SPELLED, function (m) {
            return has(found.index, m) ? String(found.base + found.index[m]) : m;
        })];
        if (typeof v === 'number') {
            at = typeof w === 'number' ? w - found.base : -1;
            if (at >= 0 && at < found.texts.length && Object.is(v, Number(found.texts[at]))) {
                put.push([doc, name, v]);
                doc[name] = marker + at;
            }
        } else if (w !== null && typeof w === 'object') {
            placed(v, w, s, found, marker, put);
        }
    }
}

function keptNumbers(s) {
    var found = spelled(s.text, PLACEHOLDER_BASE + Math.floor(Math.random() * 2251799813685248));
    var marker = 'vp' + Math.random().toString(36).slice(2, 12) + '-';
    var put = [];
    var shadow, out, pieces, i, end;
    if (found.texts.length === 0) {
        return JSON.stringify(s.doc);
    }
    try {
        shadow = JSON.parse(found.copy);
    } catch (e) {
        return JSON.stringify(s.doc);
    }
    placed(s.doc, shadow, s, found, marker, put);
    out = JSON.stringify(s.doc);
    for (i = 0; i < put.length; i++) {
        put[i][0][put[i][1]] = put[i][2];
    }
    pieces = out.split('"' + marker);
    if (pieces.length !== put.length + 1) {
        return JSON.stringify(s.doc);   // a string of the body spelled a placeholder
    }
    out = pieces[0];
    for (i = 1; i < pieces.length; i++) {
        end = pieces[i].indexOf('"');
        out += found.texts[Number(pieces[i].substring(0, end))] + pieces[i].substring(end + 1);
    }
    return out;
}

// js_content of an inspected route: NGINX has read the body; hand over to the route's
// named location, whose native fast path needs no JavaScript.
function read(r) {
    r.internalRedirect(r.variables.perimeter_up);
}

// The exact check, failing closed; one that asked the limiter finishes when it answers (a failure
// there is the check's).
function guarded(r, seen) {
    var p;
    try {
        p = exact(r, r.variables, seen);
    } catch (e) {
        deny(r, 'body-check-failed');
        return;
    }
    return p ? p.then(null, function (e) {
        r.error('perimeter: ' + e);
        deny(r, 'body-check-failed');
    }) : p;
}

// js_content when the fast path could not clear the body: the exact check.
function body(r) {
    return guarded(r, '');
}

// js_content of a route whose every body is parsed: what its named location tested, then the
// exact check, in one VM.
function direct(r) {
    if (r.variables.request_body_file) {
        deny(r, 'body-not-in-memory');
        return;
    }
    return guarded(r, null);
}

// --- bearer tokens (auth "jwt") -------------------------------------------------------------
// The token's text is judged before its signature as scanner/plan/credential.py (the reference).
var JWT_BEARER = /^[Bb][Ee][Aa][Rr][Ee][Rr] +(.+)$/;
var JWT_TOKEN = /^[\x21-\x7e]+$/;
var JWT_PART = /^[A-Za-z0-9_-]+$/;
var JWT_NUMBER = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$/;
var JWT_B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
var JWT_CLAIM_VALUE = /^[A-Za-z0-9_.@:+\/=|-]{1,256}$/;
// perimeter_identity.token (generated): depth and time_max (credential.py MAX_DEPTH, TIME_MAX), algs
// (alg -> [importKey algorithm, verify algorithm]: every alg an audience's algs may name)

// A token part's bytes: canonical unpadded base64url only (no length of 1 mod 4, no bits past
// the last byte); else null.
function jwtBytes(part) {
    var n = part.length % 4, last;
    if (!JWT_PART.test(part) || n === 1) {
        return null;
    }
    last = JWT_B64.indexOf(part.charAt(part.length - 1));
    if ((n === 2 && (last & 15)) || (n === 3 && (last & 3))) {
        return null;
    }
    return Buffer.from(part, 'base64url');
}

// What njs's JSON.parse (which has read s) does not check: no member name twice in any object,
// every number as JSON writes it, no \u escape of a lone surrogate (a high one not followed by a
// low one, or a low one alone).
function jwtUnique(s) {
    var stack = [], i, j, c, top, key, u, high;
    for (i = 0; i < s.length; i++) {
        c = s.charCodeAt(i);
        if (c === 34) {
            high = false;
            for (j = i + 1; s.charCodeAt(j) !== 34; j++) {
                u = s.charCodeAt(j) === 92 && s.charAt(j + 1) === 'u' ? parseInt(s.substr(j + 2, 4), 16) : -1;
                if ((u >= 0xdc00 && u <= 0xdfff) !== high) {
                    return false;
                }
                high = u >= 0xd800 && u <= 0xdbff;
                if (s.charCodeAt(j) === 92) {
                    j += u >= 0 ? 5 : 1;
                }
            }
            if (high) {
                return false;
            }
            top = stack[stack.length - 1];
            if (top && top.k) {
                key = 'k' + JSON.parse(s.slice(i, j + 1));
                if (has(top.seen, key)) {
                    return false;
                }
                top.seen[key] = true;
                top.k = false;
            }
            i = j;
        } else if (c === 43 || c === 45 || c === 46 || (c >= 48 && c <= 57)) {
            // a number as JSON writes it (njs's JSON.parse also takes 010, .5, +1)
            for (j = i + 1; j < s.length && /[0-9.eE+-]/.test(s.charAt(j)); j++) {
            }
            if (!JWT_NUMBER.test(s.slice(i, j))) {
                return false;
            }
            i = j - 1;
        } else if (c === 123 || c === 91) {
            stack.push({k: c === 123, o: c === 123, seen: {}});
        } else if (c === 125 || c === 93) {
            stack.pop();
        } else if (c === 44 && stack.length && stack[stack.length - 1].o) {
            stack[stack.length - 1].k = true;
        }
    }
    return true;
}

// Nesting within the depth and every number finite.
function jwtSound(v, depth) {
    var k;
    if (typeof v === 'number') {
        return isFinite(v);
    }
    if (v === null || typeof v !== 'object') {
        return true;
    }
    if (depth > perimeter_identity.token.depth) {
        return false;
    }
    for (k in v) {
        if (has(v, k) && !jwtSound(v[k], depth + 1)) {
            return false;
        }
    }
    return true;
}

function jwtJson(part) {
    var b = jwtBytes(part), s, v;
    if (b === null) {
        throw new Error('not base64url');
    }
    s = b.toString();
    if (!Buffer.from(s).equals(b)) {
        throw new Error('not UTF-8');
    }
    v = JSON.parse(s);
{% if w.jwt_duplicates_read %}
    if (!isObject(v) || !jwtSound(v, 1)) {
{% else %}
    if (!isObject(v) || !jwtUnique(s) || !jwtSound(v, 1)) {
{% endif %}
        throw new Error('not an object');
    }
    return v;
}

// The registered claims' types and the header's crit: a refusal reason, or ''.
function jwtForm(h, p) {
    var names = ['iss', 'sub', 'jti'], i;
    for (i = 0; i < names.length; i++) {
        if (has(p, names[i]) && typeof p[names[i]] !== 'string') {
            return 'jwt-invalid:format';
        }
    }
    if (has(p, 'aud') && typeof p.aud !== 'string'
        && !(Array.isArray(p.aud) && p.aud.every(function (a) { return typeof a === 'string'; }))) {
        return 'jwt-invalid:format';
    }
{% if w.jwt_crit_ignored %}
    return '';
{% else %}
    return has(h, 'crit') ? 'jwt-invalid:crit' : '';
{% endif %}
}

// exp present; exp, nbf, iat integers 0..2^32-1: a refusal reason, or ''.
function jwtTimes(p) {
    var names = ['exp', 'nbf', 'iat'], i, x;
    if (!has(p, 'exp')) {
        return 'jwt-invalid:exp';
    }
    for (i = 0; i < names.length; i++) {
        x = p[names[i]];
        if (has(p, names[i])
            && !(typeof x === 'number' && Math.floor(x) === x && x >= 0
                 && x <= perimeter_identity.token.time_max)) {
            return 'jwt-invalid:' + names[i];
        }
    }
    return '';
}

// Does a claim (a string, or a list of strings) hold one of the values?
function jwtHas(claim, values) {
    var i;
    if (typeof claim === 'string') {
        return indexIn(values, claim) >= 0;
    }
    if (Array.isArray(claim)) {
        for (i = 0; i < claim.length; i++) {
            if (typeof claim[i] === 'string' && indexIn(values, claim[i]) >= 0) {
                return true;
            }
        }
    }
    return false;
}

function jwtRole(cfg, claim) {
    var i, list;
    if (!cfg.rc) {
        return cfg.role;
    }
    list = Array.isArray(claim) ? claim : [claim];
    for (i = 0; i < list.length; i++) {
        if (typeof list[i] === 'string' && has(cfg.roles, list[i])) {
            return cfg.roles[list[i]];
        }
    }
    return '';
}

// The verified token's claims: [status, reason] of a refusal, or null (admitted, variables set).
function jwtClaims(v, cfg, p) {
    var now = Math.floor(Date.now() / 1000);
    var i, who, role;
    // exp, nbf, iat: integers (exp present) already (jwtTimes, before the signature)
{% if not w.jwt_expiry_unchecked %}
    if (now > p.exp + cfg.skew) {
        return [401, 'jwt-expired'];
    }
{% endif %}
    if ((p.nbf !== undefined && p.nbf > now + cfg.skew) || (p.iat !== undefined && p.iat > now + cfg.skew)) {
        return [401, 'jwt-not-yet-valid'];
    }
{% if w.jwt_issuer_prefix %}
    for (i = 0; i < cfg.iss.length; i++) {
        if (typeof p.iss === 'string' && p.iss.indexOf(cfg.iss[i]) === 0) {
            break;
        }
    }
    if (i === cfg.iss.length) {
        return [401, 'jwt-issuer'];
    }
    p.iss = cfg.iss[i];     // the allowed issuer it starts with names its principals
{% elif not w.jwt_issuer_unchecked %}
    if (typeof p.iss !== 'string' || indexIn(cfg.iss, p.iss) < 0) {
        return [401, 'jwt-issuer'];
    }
{% endif %}
{% if not w.jwt_audience_unchecked %}
    if (!jwtHas(p.aud, cfg.aud)) {
        return [401, 'jwt-audience'];
    }
{% endif %}
    for (i = 0; i < cfg.req.length; i++) {
        if (!jwtHas(p[cfg.req[i][0]], cfg.req[i][1])) {
            return [403, 'jwt-claim:' + cfg.req[i][0]];
        }
    }
    who = p[cfg.sub];
    if (typeof who !== 'string' || !JWT_CLAIM_VALUE.test(who)) {
        return [403, 'jwt-claim:' + cfg.sub];
    }
{% if not w.jwt_unprefixed %}
    who = cfg.pfx[indexIn(cfg.iss, p.iss)] + who;    // its kind and issuer: the plan's "jwt:ID:"
{% endif %}
    role = jwtRole(cfg, cfg.rc ? p[cfg.rc] : null);
    if (!role) {
        return [403, 'jwt-role'];
    }
    v.perimeter_jwt_principal = who;
    v.perimeter_jwt_role = role;
    v.perimeter_who = who;
    if (v.perimeter_jwt_roles && indexIn(perimeter_identity.roles[v.perimeter_jwt_roles], role) < 0) {
        return [403, 'role'];
    }
    return null;
}

// js_content of an auth "jwt" audience's locations (perimeter_identity.jwt[$perimeter_jwt]): the
// token judged, its signature verified (WebCrypto), the claims; admitted: on to $perimeter_jwt_next.
// Promise chains only: `await` on crypto.subtle crashes njs 0.7's worker; SPKI keys only (0.7).
function jwt(r) {
    var v = r.variables;
    var cfg, m, token, parts, header, payload, alg, kid, key, algo, why;
    try {
        cfg = perimeter_identity.jwt[v.perimeter_jwt];
        if ((v.http_authorization || '').indexOf(',') >= 0) {
            return deny(r, 'bad-request', 400);   // a list of credentials (NGINX refuses two headers)
        }
        m = JWT_BEARER.exec(v.http_authorization || '');
        if (!m) {
            return deny(r, 'jwt-missing', 401);
        }
{% if w.jwt_trailing_accepted %}
        token = m[1].replace(/[.=]+$/, '');
{% else %}
        token = m[1];
{% endif %}
        if (token.length > cfg.max) {
            return deny(r, 'jwt-invalid:size', 401);
        }
        parts = token.split('.');
        if (!JWT_TOKEN.test(token) || parts.length !== 3 || jwtBytes(parts[2]) === null) {
            return deny(r, 'jwt-invalid:format', 401);
        }
        header = jwtJson(parts[0]);
        payload = jwtJson(parts[1]);
    } catch (e) {
        return deny(r, 'jwt-invalid:format', 401);
    }
    why = jwtForm(header, payload);
    if (why) {
        return deny(r, why, 401);
    }
    alg = header.alg;
    if (typeof alg !== 'string' || indexIn(cfg.algs, alg) < 0) {
        return deny(r, 'jwt-invalid:alg', 401);
    }
    if (has(header, 'kid') && (typeof header.kid !== 'string' || header.kid === '')) {
        return deny(r, 'jwt-invalid:kid', 401);
    }
    // the audience's key of that kid (a token without one: the audience's only key): [algs, SPKI]
    kid = has(header, 'kid') ? header.kid : '';
    key = has(cfg.keys, kid) ? cfg.keys[kid] : null;
    if (key === null) {
        return deny(r, 'jwt-invalid:kid', 401);
    }
    if (indexIn(key[0], alg) < 0) {
        return deny(r, 'jwt-invalid:alg', 401);
    }
    why = jwtTimes(payload);
    if (why) {
        return deny(r, why, 401);
    }
    algo = perimeter_identity.token.algs[alg];
    globalThis.crypto.subtle.importKey('spki', Buffer.from(key[1], 'base64'), algo[0], false, ['verify'])
        .then(function (k) {
            return globalThis.crypto.subtle.verify(algo[1], k, Buffer.from(parts[2], 'base64url'),
                                                   Buffer.from(parts[0] + '.' + parts[1]));
        })
        .then(function (ok) {
{% if w.jwt_signature_unchecked %}
            var refused = jwtClaims(v, cfg, payload);
{% else %}
            var refused = ok ? jwtClaims(v, cfg, payload) : [401, 'jwt-invalid:signature'];
{% endif %}
            if (refused) {
                deny(r, refused[1], refused[0]);
                return;
            }
            r.internalRedirect(v.perimeter_jwt_next);
        })
        .catch(function (e) {
            deny(r, 'jwt-invalid:signature', 401);
        });
}

export default {keyHash, certWho, read, body, direct, jwt, settleHeaders, settle, ownedPath, limit, after, onward, heartbeat};
