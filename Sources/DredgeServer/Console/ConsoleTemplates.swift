import Mustache

/// The console's pages and style, compiled into the server: nothing is fetched from elsewhere.
/// Every value goes in through `{{…}}`, which HTML-escapes it (`<`, `>`, `&`, `"`, `'`), and
/// only inside element text or double-quoted attributes; no page carries inline script or
/// style (the Content-Security-Policy forbids both).
enum ConsoleTemplates {
    /// The content type every template names (`{{% CONTENT_TYPE: DREDGE_HTML}}`).
    static let contentType = "DREDGE_HTML"

    /// HTML escaping by Unicode scalar. swift-mustache's own escapes by `Character`, a grapheme
    /// cluster: a `<` after U+0600, or a `"` before a combining accent, is part of a cluster
    /// that is not in its table, and went out raw — markup any agent could plant in its host
    /// name. Here every `<`, `>`, `&`, `"` and `'` is escaped whatever surrounds it.
    struct HTML: MustacheContentType {
        func escapeText(_ text: String) -> String { Self.escape(text) }

        static func escape(_ text: String) -> String {
            guard text.utf8.contains(where: { $0 == 0x3C || $0 == 0x3E || $0 == 0x26 || $0 == 0x22 || $0 == 0x27 }) else { return text }
            var out = String.UnicodeScalarView()
            for scalar in text.unicodeScalars {
                switch scalar {
                case "<": out.append(contentsOf: "&lt;".unicodeScalars)
                case ">": out.append(contentsOf: "&gt;".unicodeScalars)
                case "&": out.append(contentsOf: "&amp;".unicodeScalars)
                case "\"": out.append(contentsOf: "&quot;".unicodeScalars)
                case "'": out.append(contentsOf: "&#39;".unicodeScalars)
                default: out.append(scalar)
                }
            }
            return String(out)
        }
    }

    static func library() throws -> MustacheLibrary {
        MustacheContentTypes.register(HTML(), named: contentType)
        var library = MustacheLibrary()
        try library.register(layout, named: "layout")
        try library.register(signIn, named: "sign-in")
        try library.register(agents, named: "agents")
        try library.register(agent, named: "agent")
        try library.register(confirm, named: "confirm")
        try library.register(error, named: "error")
        try library.register(movingOn, named: "moving-on")
        try library.register(audit, named: "audit")
        try library.register(tokens, named: "tokens")
        try library.register(pulls, named: "pulls")
        try library.register(newPull, named: "new-pull")
        try library.register(pull, named: "pull")
        try library.register(feedback, named: "feedback")
        try library.register(logs, named: "logs")
        try library.register(record, named: "record")
        try library.register(files, named: "files")
        try library.register(tails, named: "tails")
        try library.register(newTail, named: "new-tail")
        try library.register(tail, named: "tail")
        try library.register(triggers, named: "triggers")
        try library.register(newTrigger, named: "new-trigger")
        try library.register(capture, named: "capture")
        try library.register(trigger, named: "trigger")
        return library
    }

    static let layout = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        <!doctype html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>{{title}} · Dredge</title>
        <link rel="stylesheet" href="/console/static/console.css">
        <link rel="icon" href="/console/static/icon.svg" type="image/svg+xml">
        <script src="/console/static/console.js" defer></script>
        {{$head}}{{/head}}
        </head>
        <body>
        <header>
        <a class="brand" href="/console/agents">Dredge</a>
        {{#signedIn}}
        <nav aria-label="Pages">
        <a href="/console/agents"{{#onAgents}} aria-current="page"{{/onAgents}}>Agents</a>
        <a href="/console/pulls"{{#onPulls}} aria-current="page"{{/onPulls}}>Pulls</a>
        <a href="/console/logs"{{#onLogs}} aria-current="page"{{/onLogs}}>Logs</a>
        <a href="/console/tails"{{#onLive}} aria-current="page"{{/onLive}}>Live</a>
        <a href="/console/triggers"{{#onTriggers}} aria-current="page"{{/onTriggers}}>Triggers</a>
        <a href="/console/feedback"{{#onFeedback}} aria-current="page"{{/onFeedback}}>Feedback</a>
        {{#isAdmin}}
        <a href="/console/audit"{{#onAudit}} aria-current="page"{{/onAudit}}>Audit log</a>
        <a href="/console/tokens"{{#onTokens}} aria-current="page"{{/onTokens}}>Tokens</a>
        {{/isAdmin}}
        </nav>
        <span class="zone">Times in {{zone}}{{#localZone}} <button type="button" data-zone="utc">Show UTC</button>{{/localZone}}{{^localZone}} <button type="button" data-zone="local" hidden>Show local time</button>{{/localZone}}</span>
        <form class="sign-out" method="post" action="/console/sign-out">
        <input type="hidden" name="csrf" value="{{csrf}}">
        <span title="{{accessText}}">{{tokenName}} <small>({{role}})</small></span>
        <button type="submit">Sign out</button>
        </form>
        {{/signedIn}}
        </header>
        <main>
        {{$content}}{{/content}}
        </main>
        </body>
        </html>
        """

    static let signIn = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Sign in</h1>
        {{#problem}}<p class="problem" role="alert">{{problem}}</p>{{/problem}}
        <form class="sign-in" method="post" action="/console/sign-in">
        <input type="hidden" name="csrf" value="{{csrf}}">
        {{#return}}<input type="hidden" name="return" value="{{return}}">{{/return}}
        <label for="token">Admin token</label>
        <input id="token" name="token" type="password" autocomplete="off" required autofocus>
        <button type="submit">Sign in</button>
        </form>
        <p class="hint">An admin token, as <code>dredge tokens create</code> or <code>dredge-server init</code> gave it. The session lasts {{lasts}} (no longer than the token).</p>
        {{#sso}}<p><a class="button" href="{{sso}}">Sign in with single sign-on</a></p>{{/sso}}
        {{/content}}
        {{/layout}}
        """

    /// A page that moves on by itself (after a single sign-on, to the page asked for; after
    /// its sign-out, to the provider's).
    static let movingOn = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$head}}<meta http-equiv="refresh" content="0; url={{target}}">{{/head}}
        {{$content}}
        <p>{{message}} <a href="{{target}}">Continue</a></p>
        {{/content}}
        {{/layout}}
        """

    static let error = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>{{heading}}</h1>
        <p class="problem" role="alert">{{message}}</p>
        <p><a href="/console/agents">Back to the console</a></p>
        {{/content}}
        {{/layout}}
        """

    static let agents = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Agents</h1>
        <form class="filter" method="get" action="/console/agents" role="search">
        <label for="q">Filter</label>
        <input id="q" name="q" type="search" value="{{query}}" placeholder="any host, app, user or id">
        <button type="submit">Filter</button>
        </form>
        <p class="summary">{{online}} online of {{total}}{{#filtered}}; {{shown}} match “{{query}}”{{/filtered}}</p>
        <div class="table-wrap">
        <table class="agents cards">
        <thead><tr><th scope="col">Status</th><th scope="col">Host</th><th scope="col">App</th><th scope="col">Users seen</th><th scope="col">Records</th><th scope="col">Last seen</th><th scope="col">Agent</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr>
        <td data-label="Status"><span class="status {{status}}">{{status}}</span></td>
        <td data-label="Host"><a href="/console/agents/{{agentID}}">{{host}}</a>{{#labels}}<br><small>{{labels}}</small>{{/labels}}</td>
        <td data-label="App">{{app}}</td>
        <td data-label="Users seen" class="wrap">{{users}}</td>
        <td data-label="Records">{{records}}</td>
        <td data-label="Last seen" class="nowrap">{{lastSeen}}</td>
        <td data-label="Agent"><code title="{{agentID}}">{{shortID}}</code></td>
        </tr>
        {{/rows}}
        {{^rows}}<tr><td colspan="7">No agent{{#filtered}} matches{{/filtered}}.</td></tr>{{/rows}}
        </tbody>
        </table>
        </div>
        {{/content}}
        {{/layout}}
        """

    static let agent = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>{{host}} <span class="status {{status}}">{{status}}</span></h1>
        <dl class="facts">
        <dt>App</dt><dd>{{app}}</dd>
        <dt>System</dt><dd>{{os}}</dd>
        {{#labels}}<dt>Labels</dt><dd>{{labels}}</dd>{{/labels}}
        <dt>Records in its store</dt><dd>{{records}}</dd>
        <dt>Last seen</dt><dd>{{lastSeen}}{{#address}} from {{address}}{{/address}}</dd>
        <dt>Enrolled</dt><dd>{{enrolledAt}}</dd>
        <dt>Agent</dt><dd><code>{{agentID}}</code></dd>
        {{#revokedAt}}<dt>Revoked</dt><dd class="danger">{{revokedAt}} by {{revokedBy}}: it may not connect again</dd>{{/revokedAt}}
        </dl>
        <p class="links">{{^revokedAt}}{{#mayPull}}<a class="button" href="/console/pulls/new?agent={{agentID}}">Pull this device</a> {{/mayPull}}{{/revokedAt}}<a href="{{logs}}">Its logs pulled so far</a>{{^revokedAt}}{{#isAdmin}} <a class="danger" href="/console/agents/{{agentID}}/revoke">Revoke this device…</a>{{/isAdmin}}{{/revokedAt}}</p>
        <h2>Users on this device</h2>
        <div class="table-wrap">
        <table class="cards">
        <thead><tr><th scope="col">User</th><th scope="col"></th></tr></thead>
        <tbody>
        {{#users}}
        <tr><td data-label="User">{{uid}}</td><td data-label="" class="links">{{#mayPull}}<a href="{{pull}}">Pull this user</a> <a href="{{pullHere}}">on this device only</a> {{^revokedAt}}<a class="watch" href="{{watch}}">Watch live</a> {{/revokedAt}}{{/mayPull}}<a href="{{logs}}">Their logs</a></td></tr>
        {{/users}}
        {{^users}}<tr><td colspan="2">No user seen lately.</td></tr>{{/users}}
        </tbody>
        </table>
        </div>
        {{#moreUsers}}<p class="hint">{{moreUsers}}</p>{{/moreUsers}}
        <h2>Recent pulls of this device</h2>
        <div class="table-wrap">
        <table class="cards">
        <thead><tr><th scope="col">Pull</th><th scope="col">Asked</th><th scope="col">By</th><th scope="col">Reason</th><th scope="col">Status</th></tr></thead>
        <tbody>
        {{#pulls}}
        <tr><td data-label="Pull"><a href="/console/pulls/{{id}}"><code>{{shortID}}</code></a></td><td data-label="Asked" class="nowrap">{{issuedAt}}</td><td data-label="By">{{by}}</td><td data-label="Reason" class="wrap">{{reason}}</td><td data-label="Status">{{status}}</td></tr>
        {{/pulls}}
        {{^pulls}}<tr><td colspan="5">None among the last {{looked}} pulls.</td></tr>{{/pulls}}
        </tbody>
        </table>
        </div>
        {{/content}}
        {{/layout}}
        """

    /// A question before something that cannot be undone: a form that posts, and a way back.
    static let confirm = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>{{heading}}</h1>
        {{#problem}}<p class="problem" role="alert">{{problem}}</p>{{/problem}}
        <p>{{question}}</p>
        <form class="confirm" method="post" action="{{action}}">
        <input type="hidden" name="csrf" value="{{csrf}}">
        {{#hidden}}<input type="hidden" name="{{name}}" value="{{value}}">{{/hidden}}
        {{#askReason}}
        <label for="reason">Reason</label>
        <input id="reason" name="reason" maxlength="256" autocomplete="off" placeholder="e.g. SUP-1234 (recorded in the audit log)">
        {{/askReason}}
        <button type="submit" class="danger">{{button}}</button>
        <a href="{{back}}">Cancel</a>
        </form>
        {{/content}}
        {{/layout}}
        """

    static let icon = """
        <svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" fill="#0b57d0"/><path d="M4 4h4.5a4 4 0 0 1 0 8H4z" fill="#fff"/></svg>
        """

    static let audit = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Audit log</h1>
        <form class="filter" method="get" action="/console/audit" role="search">
        <label for="actor">Actor</label>
        <input id="actor" name="actor" value="{{actor}}" placeholder="any (a token's name)">
        <label for="action">Action</label>
        <select id="action" name="action">
        <option value="">any</option>
        {{#actions}}<option value="{{name}}"{{#selected}} selected{{/selected}}>{{name}}</option>{{/actions}}
        </select>
        <button type="submit">Show</button>
        </form>
        <div class="table-wrap">
        <table class="cards">
        <thead><tr><th scope="col">#</th><th scope="col">When</th><th scope="col">Actor</th><th scope="col">Action</th><th scope="col">Detail</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr><td data-label="#">{{id}}</td><td data-label="When" class="nowrap">{{at}}</td><td data-label="Actor">{{actor}}</td><td data-label="Action" class="nowrap">{{action}}</td><td data-label="Detail" class="detail">{{detail}}</td></tr>
        {{/rows}}
        {{^rows}}<tr><td colspan="5">Nothing recorded.</td></tr>{{/rows}}
        </tbody>
        </table>
        </div>
        {{#older}}<p><a href="{{older}}">Older entries</a></p>{{/older}}
        {{/content}}
        {{/layout}}
        """

    static let tokens = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Tokens</h1>
        {{#problem}}<p class="problem" role="alert">{{problem}}</p>{{/problem}}
        {{#created}}
        <div class="created" role="status">
        <p>The new {{kind}} token “{{name}}”, shown this once: copy it now.</p>
        <p><code class="token">{{token}}</code></p>
        </div>
        {{/created}}
        <div class="table-wrap">
        <table class="cards">
        <thead><tr><th scope="col">Name</th><th scope="col">Kind</th><th scope="col">Role</th><th scope="col">Created</th><th scope="col">Limits</th><th scope="col"></th></tr></thead>
        <tbody>
        {{#rows}}
        <tr>
        <td data-label="Name">{{name}}{{#yours}} <small>(this session's)</small>{{/yours}}</td>
        <td data-label="Kind">{{kind}}</td>
        <td data-label="Role">{{access}}</td>
        <td data-label="Created" class="nowrap">{{createdAt}}</td>
        <td data-label="Limits">{{limits}}</td>
        <td data-label=""><a class="revoke" href="{{revoke}}" aria-label="Revoke the {{kind}} token {{name}}">Revoke…</a></td>
        </tr>
        {{/rows}}
        </tbody>
        </table>
        </div>
        <h2>New token</h2>
        <form class="create" method="post" action="/console/tokens">
        <input type="hidden" name="csrf" value="{{csrf}}">
        <label for="name">Name</label>
        <input id="name" name="name" required maxlength="64" autocomplete="off">
        <label for="kind">Kind</label>
        <select id="kind" name="kind">
        <option value="admin">admin (engineers)</option>
        <option value="enrollment">enrollment (agents)</option>
        </select>
        <label for="role">Role (admin)</label>
        <select id="role" name="role">
        <option value="reader">reader: reads what was pulled</option>
        <option value="investigator">investigator: also pulls</option>
        <option value="admin">admin: everything</option>
        </select>
        <label for="apps">Only apps (reader, investigator)</label>
        <input id="apps" name="apps" maxlength="1024" autocomplete="off" placeholder="oven-control@>=2.1 billing">
        <label for="labels">Only devices labelled</label>
        <input id="labels" name="labels" maxlength="1024" autocomplete="off" placeholder="region=eu">
        <label for="expires">Expires after</label>
        <select id="expires" name="expires">
        <option value="">never</option>
        <option value="3600">an hour</option>
        <option value="86400">a day</option>
        <option value="604800">a week</option>
        <option value="2592000">30 days</option>
        </select>
        <label for="uses">Uses (enrollment)</label>
        <input id="uses" name="uses" inputmode="numeric" pattern="[0-9]*" maxlength="7" autocomplete="off" placeholder="any number">
        <button type="submit">Create</button>
        </form>
        <p class="hint">Names are 1 to 64 letters, digits, “-”, “_” or “.”. An admin token has a role: a reader searches and downloads what was pulled, an investigator also pulls, an admin does everything. A reader's or investigator's scope (apps, separated by spaces, each with versions as <code>app@&gt;=2.1,&lt;3</code>; labels as <code>name=value</code>) limits it to those devices. A revoked or expired admin token's sessions end at once; the last admin token with the role admin and no expiry cannot be revoked. An enrollment token may expire and be limited to a number of agents: a device enrolling after either is refused, and agents already enrolled keep working.</p>
        {{/content}}
        {{/layout}}
        """

    static let pulls = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Pulls</h1>
        {{#mayPull}}<p><a class="button" href="/console/pulls/new">New pull</a></p>{{/mayPull}}
        <form class="filter" method="get" action="/console/pulls" role="search">
        <label for="reason">Reason</label>
        <input id="reason" name="reason" type="search" value="{{reason}}" maxlength="256" placeholder="e.g. SUP-1234">
        <button type="submit">Find</button>
        </form>
        {{#problem}}<p class="problem" role="alert">{{problem}}</p>{{/problem}}
        <div class="table-wrap">
        <table class="cards">
        <thead><tr><th scope="col">Pull</th><th scope="col">Asked</th><th scope="col">By</th><th scope="col">For</th><th scope="col">Reason</th><th scope="col">Where it stands</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr><td data-label="Pull"><a href="/console/pulls/{{id}}"><code>{{shortID}}</code></a></td><td data-label="Asked" class="nowrap">{{issuedAt}}</td><td data-label="By">{{by}}</td><td data-label="For">{{who}}</td><td data-label="Reason" class="wrap">{{reason}}</td><td data-label="Where it stands">{{status}}</td></tr>
        {{/rows}}
        {{^rows}}<tr><td colspan="6">{{#filtered}}No pull's reason holds “{{reason}}”.{{/filtered}}{{^filtered}}No pull yet.{{/filtered}}</td></tr>{{/rows}}
        </tbody>
        </table>
        </div>
        {{/content}}
        {{/layout}}
        """

    static let newPull = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>New pull</h1>
        {{#problem}}<p class="problem" role="alert">{{problem}}</p>{{/problem}}
        <form class="pull" method="post" action="/console/pulls">
        <input type="hidden" name="csrf" value="{{csrf}}">
        <label for="uid">User id</label>
        <input id="uid" name="uid" value="{{uid}}" autocomplete="off">
        <label for="agent">Device</label>
        <select id="agent" name="agent">
        <option value="">every device that holds the user</option>
        {{#agents}}<option value="{{id}}"{{#selected}} selected{{/selected}}>{{label}}</option>{{/agents}}
        </select>
        <fieldset>
        <legend>Time</legend>
        {{#ranges}}<label><input type="radio" name="range" value="{{value}}"{{#checked}} checked{{/checked}}> {{label}}</label>{{/ranges}}
        <label for="since">from</label> <input id="since" name="since" value="{{since}}" autocomplete="off" placeholder="e.g. 2d, yesterday, 2026-11-20 10:00">
        <label for="until">to</label> <input id="until" name="until" value="{{until}}" autocomplete="off" placeholder="e.g. 1h, 2026-11-21 (empty: now)">
        </fieldset>
        <fieldset>
        <legend>Levels (none: all)</legend>
        {{#levels}}<label><input type="checkbox" name="level-{{name}}"{{#checked}} checked{{/checked}}> {{name}}</label>{{/levels}}
        </fieldset>
        <label for="types">Types</label>
        <input id="types" name="types" value="{{types}}" placeholder="e.g. app, network (empty: all)">
        <label for="text">Contains</label>
        <input id="text" name="text" value="{{text}}" placeholder="any (a substring of the message or metadata)">
        <label for="reason">Reason</label>
        <input id="reason" name="reason" value="{{reason}}" maxlength="256" placeholder="e.g. SUP-1234 (kept with the pull)">
        <label class="check"><input type="checkbox" name="urgent"{{#urgent}} checked{{/urgent}}> Urgent: devices whose upload policy allows it send it at once, also on a metered network</label>
        <button type="submit">Pull</button>
        </form>
        <p class="hint">A user id, a device, or both. The pull waits up to an hour for devices that are offline.</p>
        {{/content}}
        {{/layout}}
        """

    static let pull = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Pull <code>{{id}}</code></h1>
        <dl class="facts">
        <dt>For</dt><dd>{{who}}</dd>
        <dt>Filter</dt><dd>{{filter}}</dd>
        <dt>Asked by</dt><dd>{{by}}, {{issuedAt}}</dd>
        {{#reason}}<dt>Reason</dt><dd>{{reason}}</dd>{{/reason}}
        {{#urgent}}<dt>Urgent</dt><dd>yes: devices whose upload policy allows urgent pulls send it at once</dd>{{/urgent}}
        {{#approved}}<dt>Approved</dt><dd>{{approved}}</dd>{{/approved}}
        {{#awaiting}}<dt>Approved</dt><dd><strong>Not yet: awaiting approval</strong> by an investigator or admin other than {{by}}; no device is sent it until then.</dd>{{/awaiting}}
        <dt>Waits until</dt><dd>{{expiresAt}}</dd>
        {{#removed}}<dt>Removed</dt><dd>{{removed}}</dd>{{/removed}}
        </dl>
        <div class="table-wrap">
        <table class="cards"{{#open}} data-events="/console/pulls/{{id}}/events"{{/open}}>
        <thead><tr><th scope="col">Device</th><th scope="col">Status</th><th scope="col">Progress</th><th scope="col">Files</th><th scope="col">Detail</th></tr></thead>
        <tbody>
        {{#targets}}
        <tr data-agent="{{agentID}}"><td data-label="Device">{{host}} <code title="{{agentID}}">{{shortID}}</code></td><td data-label="Status"><span class="status {{status}}">{{status}}</span></td><td data-label="Progress" class="progress">{{progress}}</td><td data-label="Files" class="files">{{files}}</td><td data-label="Detail" class="detail">{{detail}}</td></tr>
        {{/targets}}
        {{#waiting}}<tr><td colspan="5">No device holds the user yet: the pull waits for one until it expires.</td></tr>{{/waiting}}
        </tbody>
        </table>
        </div>
        {{#mayApprove}}
        <form class="approve" method="post" action="/console/pulls/{{id}}/approve">
        <input type="hidden" name="csrf" value="{{csrf}}">
        <button type="submit">Approve this pull</button>
        </form>
        {{/mayApprove}}
        {{#open}}<p class="hint" id="live">Updated as it happens.</p>{{/open}}
        <p class="links"><a href="/console/logs?pull={{id}}">Read its logs</a>{{#watch}}{{#mayPull}} <a class="watch" href="{{watch}}">Watch live</a>{{/mayPull}}{{/watch}} <a href="/console/pulls/{{id}}/files">Files</a>{{^removed}}{{#isAdmin}} <a class="danger" href="/console/pulls/{{id}}/remove">Remove its files…</a>{{/isAdmin}}{{/removed}}</p>
        {{/content}}
        {{/layout}}
        """

    static let feedback = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Feedback</h1>
        <div class="table-wrap">
        <table class="cards">
        <thead><tr><th scope="col">Given</th><th scope="col">User</th><th scope="col">Device</th><th scope="col">What they said</th><th scope="col">Upload</th><th scope="col">Read</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr data-id="{{id}}"><td data-label="Given" class="nowrap">{{createdAt}}</td><td data-label="User">{{uid}}</td><td data-label="Device">{{host}}</td><td data-label="What they said" class="said">{{text}}</td><td data-label="Upload" class="wrap">{{status}}</td><td data-label="Read" class="links"><a class="moment" href="{{moment}}">At that moment</a> <a href="/console/logs?feedback={{id}}">Its logs</a> <a href="/console/feedback/{{id}}/files">Files</a> <code title="{{id}}">{{shortID}}</code></td></tr>
        {{/rows}}
        {{^rows}}<tr><td colspan="6">No feedback yet.</td></tr>{{/rows}}
        </tbody>
        </table>
        </div>
        <p class="hint">“At that moment” opens the user's timeline, across everything pulled, where they gave the feedback; “Its logs” the records that came with it.</p>
        {{/content}}
        {{/layout}}
        """

    static let logs = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Logs</h1>
        <form class="logs" method="get" action="/console/logs" role="search">
        <label>User <input name="uid" value="{{uid}}"></label>
        <label>Pull <input name="pull" value="{{pull}}" size="34"></label>
        <label>Feedback <input name="feedback" value="{{feedback}}" size="34"></label>
        <label>Device <input name="host" value="{{host}}" placeholder="e.g. oven-7" size="14"></label>
        <label>App <input name="app" value="{{app}}" size="12"></label>
        <label>Level <input name="level" value="{{level}}" placeholder="e.g. warning+" size="10"></label>
        <label>Type <input name="type" value="{{type}}" placeholder="e.g. network" size="10"></label>
        <label>Words <input name="text" value="{{text}}" placeholder="e.g. payment declined"></label>
        <label>Where <input name="where" value="{{where}}" placeholder="e.g. http.status=503"></label>
        <label>From <input name="since" value="{{since}}" placeholder="e.g. 2d, 2026-11-20 10:00" size="22"></label>
        <label>To <input name="until" value="{{until}}" placeholder="e.g. 1h (empty: now)" size="22"></label>
        <button type="submit">Search</button>
        </form>
        {{#problem}}<p class="problem" role="alert">{{problem}}</p>{{/problem}}
        {{#hint}}<p class="hint">{{hint}}</p>{{/hint}}
        {{#indexing}}<p class="hint">{{indexing}}</p>{{/indexing}}
        {{#searched}}
        {{#stats}}
        <section class="stats" aria-label="What the search matches">
        <p class="summary"><strong>{{total}}.</strong>{{#partial}} {{partial}}{{/partial}}
        {{#levels}}<a class="count level-{{name}}" href="{{href}}">{{name}} {{count}}</a> {{/levels}}
        {{#hasHosts}}<span class="hosts">On</span>{{/hasHosts}} {{#hosts}}{{#href}}<a class="count" href="{{href}}">{{name}} {{count}}</a>{{/href}}{{^href}}<span class="count">{{name}} {{count}}</span>{{/href}} {{/hosts}}{{#moreHosts}}<span class="hint">{{moreHosts}}</span>{{/moreHosts}}</p>
        {{#histogram}}
        <figure class="histogram">
        <svg viewBox="0 0 600 100" preserveAspectRatio="none" role="img" aria-label="{{label}}" data-from="{{from}}" data-to="{{to}}" data-zoom="{{zoom}}">
        {{#bars}}<a href="{{href}}"><title>{{title}}</title>{{#rects}}<rect class="h-{{level}}" x="{{x}}" y="{{y}}" width="{{w}}" height="{{h}}"></rect>{{/rects}}</a>{{/bars}}
        </svg>
        <figcaption><span>{{fromText}}</span> <span class="hint">a bar, or a drag across the bars, narrows the time</span> <span>{{toText}}</span></figcaption>
        </figure>
        {{/histogram}}
        </section>
        {{/stats}}
        <nav class="pages" aria-label="Pages of records">{{#first}}<a href="{{first}}">First</a>{{/first}}{{#previous}}<a href="{{previous}}" rel="prev" id="previous-page">Previous page</a>{{/previous}}{{#next}}<a href="{{next}}" rel="next" id="next-page">Next page</a>{{/next}}<a href="{{latest}}">Latest</a>{{#watch}}{{#mayPull}} <a class="watch" href="{{watch}}">Watch live</a>{{/mayPull}}{{/watch}} <a href="{{groupLink}}">{{#grouped}}Show every record{{/grouped}}{{^grouped}}Group repeats{{/grouped}}</a></nav>
        <div class="table-wrap">
        <table class="logs cards" id="records"{{#follow}} data-follow="{{follow}}"{{/follow}}>
        <thead><tr><th scope="col">Time</th><th scope="col">Host</th><th scope="col">App</th><th scope="col">Level</th><th scope="col">Type</th><th scope="col">User</th><th scope="col">Message</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr class="level-{{level}}{{#current}} current{{/current}}" data-id="{{id}}"{{#current}} aria-current="true"{{/current}}><td data-label="Time" class="nowrap"><a class="open" href="/console/records/{{id}}">{{time}}</a></td><td data-label="Host">{{host}}</td><td data-label="App">{{app}}</td><td data-label="Level" class="level">{{level}}</td><td data-label="Type">{{type}}</td><td data-label="User">{{uid}}</td><td data-label="Message" class="message">{{#repeated}}<span class="repeated" title="records with the same message, level, type, user and device, one after another on this page (their metadata may differ): the first is shown">{{repeated}}</span> {{/repeated}}{{message}}{{#metadata}}<br><small>{{metadata}}</small>{{/metadata}}</td></tr>
        {{/rows}}
        </tbody>
        </table>
        </div>
        <aside id="detail" class="detail" hidden tabindex="-1" aria-label="The record opened"></aside>
        <p class="summary">{{#hasRows}}{{count}} records on this page.{{/hasRows}}{{^hasRows}}No record matches.{{#unknown}} <span class="problem">{{unknown}}</span>{{/unknown}}{{/hasRows}}{{#next}} <a href="{{next}}">Next page</a>{{/next}}{{#follow}} <button type="button" id="follow" hidden aria-pressed="false">Follow new records</button> <span id="followed" role="status"></span>{{/follow}}</p>
        <p class="hint keys">Keys: <kbd>j</kbd> and <kbd>k</kbd> (or <kbd>↓</kbd> and <kbd>↑</kbd> on a row) move through the records, <kbd>Enter</kbd> opens one beside the list, <kbd>Esc</kbd> closes it, <kbd>n</kbd> and <kbd>p</kbd> turn the page. A record's time is its permalink.</p>
        {{/searched}}
        {{/content}}
        {{/layout}}
        """

    /// One record in full (`/console/records/{id}`); the viewer's detail panel shows its article.
    static let record = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Record {{id}}</h1>
        <article class="record" aria-labelledby="record-heading">
        <h2 id="record-heading"><span class="level-{{level}}"><span class="level">{{level}}</span></span> {{type}} record from {{host}}</h2>
        <p class="links"><a class="permalink" href="/console/records/{{id}}">Permalink</a> <a href="{{timeline}}">In the timeline</a>{{#files}} <a href="{{files}}">Files of this {{sourceKind}}</a>{{/files}}</p>
        <p class="message">{{message}}</p>
        <dl class="facts">
        <dt>Time</dt><dd>{{time}} <small>{{rfc3339}}</small></dd>
        <dt>User</dt><dd>{{uid}}</dd>
        <dt>Device</dt><dd>{{host}}</dd>
        {{#app}}<dt>App</dt><dd>{{app}}</dd>{{/app}}
        {{#os}}<dt>OS</dt><dd>{{os}}</dd>{{/os}}
        {{#process}}<dt>Process</dt><dd>{{process}}</dd>{{/process}}
        <dt>Agent</dt><dd><code>{{agentID}}</code></dd>
        <dt>Came with</dt><dd>{{sourceKind}} <a href="{{sourceHref}}"><code>{{sourceID}}</code></a></dd>
        </dl>
        {{#network}}
        <section class="exchange" aria-label="The HTTP exchange">
        <h3>Request</h3>
        <p class="request-line"><strong>{{method}}</strong> <span class="url">{{url}}</span></p>
        <dl class="facts">{{#request}}<dt>{{name}}</dt><dd>{{value}}</dd>{{/request}}</dl>
        {{#requestHeaders}}<table class="headers request-headers"><caption>Request headers</caption><tbody>{{#rows}}<tr><th scope="row">{{name}}</th><td>{{value}}</td></tr>{{/rows}}</tbody></table>{{/requestHeaders}}
        {{#requestBody}}<h4>Request body</h4><pre class="body">{{requestBody}}</pre>{{/requestBody}}
        <h3>Response</h3>
        <dl class="facts response">{{#response}}<dt>{{name}}</dt><dd>{{value}}</dd>{{/response}}</dl>
        {{#responseHeaders}}<table class="headers response-headers"><caption>Response headers</caption><tbody>{{#rows}}<tr><th scope="row">{{name}}</th><td>{{value}}</td></tr>{{/rows}}</tbody></table>{{/responseHeaders}}
        {{#responseBody}}<h4>Response body</h4><pre class="body">{{responseBody}}</pre>{{/responseBody}}
        </section>
        {{/network}}
        {{#metadata}}
        <table class="metadata"><caption>Metadata</caption><tbody>{{#rows}}<tr><th scope="row">{{key}}</th><td>{{value}}</td></tr>{{/rows}}</tbody></table>
        {{/metadata}}
        <div class="table-wrap">
        <table class="logs context cards"><caption>Before and after it on this device</caption>
        <thead><tr><th scope="col">Time</th><th scope="col">Level</th><th scope="col">Type</th><th scope="col">User</th><th scope="col">Message</th></tr></thead>
        <tbody>
        {{#context}}
        <tr class="level-{{level}}{{#current}} current{{/current}}"{{#current}} aria-current="true"{{/current}}><td data-label="Time" class="nowrap"><a href="/console/records/{{id}}">{{time}}</a></td><td data-label="Level" class="level">{{level}}</td><td data-label="Type">{{type}}</td><td data-label="User">{{uid}}</td><td data-label="Message" class="message">{{message}}</td></tr>
        {{/context}}
        </tbody>
        </table>
        </div>
        </article>
        {{/content}}
        {{/layout}}
        """

    /// A pull's, a feedback's or a live tail's files, each a download.
    static let files = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Files of {{kind}} <code>{{id}}</code></h1>
        <p class="links"><a href="{{back}}">Back to the {{kind}}</a> <a href="{{logs}}">Read its logs</a>{{#zip}} <a class="button" href="{{zip}}">Everything as one zip</a>{{/zip}}</p>
        {{#note}}<p class="hint">{{note}}</p>{{/note}}
        <div class="table-wrap">
        <table class="files cards">
        <thead><tr><th scope="col">Device</th><th scope="col">File</th><th scope="col">Kind</th><th scope="col">Size</th><th scope="col">SHA-256</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr><td data-label="Device">{{host}}</td><td data-label="File"><a href="{{href}}" download>{{name}}</a></td><td data-label="Kind">{{kind}}</td><td data-label="Size" class="nowrap">{{size}}</td><td data-label="SHA-256" class="detail"><code class="digest">{{sha256}}</code></td></tr>
        {{/rows}}
        {{^rows}}<tr><td colspan="5">{{empty}}</td></tr>{{/rows}}
        </tbody>
        </table>
        </div>
        {{/content}}
        {{/layout}}
        """

    /// The pull page's live progress: its table names its event stream (`data-events`); each
    /// event updates the rows' text (never markup), a target that joined reloads the page.
    static let script = """
        "use strict";
        // The viewer's histogram: a drag across the bars narrows the search to that time.
        (function () {
          var svg = document.querySelector("figure.histogram svg[data-zoom]");
          if (!svg) { return; }
          var from = Number(svg.getAttribute("data-from")), to = Number(svg.getAttribute("data-to"));
          var start = null, band = null;
          var at = function (event) {
            var box = svg.getBoundingClientRect();
            return Math.min(1, Math.max(0, (event.clientX - box.left) / box.width));
          };
          svg.addEventListener("pointerdown", function (event) {
            start = at(event);
            band = document.createElementNS("http://www.w3.org/2000/svg", "rect");
            band.setAttribute("class", "selection");
            band.setAttribute("y", "0");
            band.setAttribute("height", "100");
            svg.appendChild(band);
            svg.setPointerCapture(event.pointerId);
          });
          svg.addEventListener("pointermove", function (event) {
            if (start === null) { return; }
            var now = at(event);
            band.setAttribute("x", String(Math.min(start, now) * 600));
            band.setAttribute("width", String(Math.abs(now - start) * 600));
          });
          svg.addEventListener("pointerup", function (event) {
            if (start === null) { return; }
            var end = at(event), low = Math.min(start, end), high = Math.max(start, end);
            start = null;
            if (high - low < 0.01) { band.remove(); return; }  // a click: the bar's own link
            event.preventDefault();
            // Milliseconds: the start rounded down and the (exclusive) end up, so the records at the edges stay in.
            var iso = function (fraction, round) { return new Date(round((from + (to - from) * fraction) / 1000)).toISOString(); };
            var zoom = svg.getAttribute("data-zoom");
            window.location.href = zoom + (zoom.indexOf("?") < 0 ? "?" : "&") + "since=" + encodeURIComponent(iso(low, Math.floor)) + "&until=" + encodeURIComponent(iso(high, Math.ceil));
          });
          svg.addEventListener("click", function (event) { if (band && band.parentNode && Number(band.getAttribute("width")) >= 6) { event.preventDefault(); } });
        })();
        // The zone times are shown in: the browser's own (a cookie the server reads), or UTC.
        (function () {
          var buttons = document.querySelectorAll("button[data-zone]");
          var local = window.Intl ? Intl.DateTimeFormat().resolvedOptions().timeZone : "";
          for (var i = 0; i < buttons.length; i++) {
            var button = buttons[i];
            if (button.getAttribute("data-zone") === "local") {
              if (!local || local === "UTC" || local === "Etc/UTC" || !/^[A-Za-z0-9_+\\/-]{1,64}$/.test(local)) { continue; }
              button.hidden = false;
            }
            button.addEventListener("click", function (event) {
              var secure = window.location.protocol === "https:" ? "; secure" : "";
              var chosen = event.currentTarget.getAttribute("data-zone") === "local" ? local : "";
              document.cookie = "dredge_console_tz=" + chosen + "; path=/console; samesite=strict" + (chosen ? "; max-age=31536000" : "; max-age=0") + secure;
              window.location.reload();
            });
          }
        })();
        (function () {
          var table = document.querySelector("table[data-events]");
          if (!table || !window.EventSource) { return; }
          var source = new EventSource(table.getAttribute("data-events"));
          source.onmessage = function (event) {
            var targets = JSON.parse(event.data);
            for (var i = 0; i < targets.length; i++) {
              var t = targets[i];
              if (!/^[0-9a-f]{32}$/.test(t.agentID)) { continue; }
              var row = table.querySelector('tr[data-agent="' + t.agentID + '"]');
              if (!row) { source.close(); window.location.reload(); return; }
              var status = row.querySelector(".status");
              status.textContent = t.status;
              status.className = "status " + t.status;
              row.querySelector(".progress").textContent = t.progress;
              row.querySelector(".files").textContent = t.files;
              row.querySelector(".detail").textContent = t.detail;
            }
          };
          source.onerror = function () {
            if (source.readyState === EventSource.CLOSED) {
              var live = document.getElementById("live");
              if (live) { live.textContent = "Not updated any more: reload the page."; }
            }
          };
          source.addEventListener("done", function () {
            source.close();
            var live = document.getElementById("live");
            if (live) { live.textContent = "Finished."; }
          });
        })();

        // The log viewer: a record opens in the detail panel beside the list (its record page's
        // article, fetched and parsed, never run); j/k (and the arrows on a row) move, Enter
        // opens, Escape closes, n/p turn the page. Without script, a record's time is a link
        // to its page.
        (function () {
          var table = document.getElementById("records");
          var panel = document.getElementById("detail");
          if (!table || !panel || !window.fetch || !window.DOMParser) { return; }
          var rows = Array.prototype.slice.call(table.querySelectorAll("tbody tr"));
          // The last page follows what arrives (as dredge logs --follow): rows appended as text.
          var follow = table.getAttribute("data-follow"), button = document.getElementById("follow");
          if (follow && button && window.EventSource) {
            // At most this many rows are added: beyond, the page stops following and says so.
            var stream = null, arrived = 0, most = 2000;
            var said = document.getElementById("followed");
            var cell = function (text, name, label) {
              var td = document.createElement("td");
              if (name) { td.className = name; }
              if (label) { td.setAttribute("data-label", label); }
              td.textContent = text;
              return td;
            };
            var stop = function (why) {
              if (stream) { stream.close(); stream = null; }
              button.textContent = "Follow new records";
              button.setAttribute("aria-pressed", "false");
              said.textContent = why;
            };
            button.hidden = false;
            button.addEventListener("click", function () {
              if (stream) { stop(arrived + " arrived; not following."); return; }
              stream = new EventSource(follow);  // from the newest record added so far (see onmessage)
              button.textContent = "Stop following";
              button.setAttribute("aria-pressed", "true");
              said.textContent = "Following: new records are added below.";
              stream.onmessage = function (event) {
                var found = JSON.parse(event.data), body = table.querySelector("tbody");
                for (var i = 0; i < found.length; i++) {
                  var r = found[i], row = document.createElement("tr");
                  row.className = "level-" + r.level + " arrived";
                  row.setAttribute("data-id", r.id);
                  var time = document.createElement("td"), open = document.createElement("a");
                  time.className = "nowrap";
                  time.setAttribute("data-label", "Time");
                  open.className = "open";
                  open.href = "/console/records/" + encodeURIComponent(r.id);
                  open.textContent = r.time;
                  time.appendChild(open);
                  var message = cell(r.message, "message", "Message");
                  if (r.metadata) {
                    var small = document.createElement("small");
                    small.textContent = r.metadata;
                    message.appendChild(document.createElement("br"));
                    message.appendChild(small);
                  }
                  [time, cell(r.host, "", "Host"), cell(r.app, "", "App"), cell(r.level, "level", "Level"), cell(r.type, "", "Type"), cell(r.uid, "", "User"), message].forEach(function (td) { row.appendChild(td); });
                  body.appendChild(row);
                  rows.push(row);
                }
                arrived += found.length;
                said.textContent = "Following: " + arrived + " arrived.";
                // Following again goes on from here, repeating nothing.
                if (/^[0-9]+$/.test(event.lastEventId)) { follow = follow.replace(/([?&]from=)[0-9]+/, "$1" + event.lastEventId); }
                if (arrived >= most) { stop(arrived + " arrived, more than this page shows: open the latest page for the rest."); }
              };
              stream.onerror = function () {
                if (stream && stream.readyState === EventSource.CLOSED) { stop("Not following any more: reload the page."); }
              };
            });
          }
          var selected = -1;
          var asked = 0;
          function link(i) { return rows[i].querySelector("a.open"); }
          function select(i, focus) {
            if (i < 0 || i >= rows.length) { return false; }
            if (selected >= 0) { rows[selected].classList.remove("selected"); }
            selected = i;
            rows[i].classList.add("selected");
            if (focus) { link(i).focus(); }
            return true;
          }
          function closeButton() {
            var button = document.createElement("button");
            button.type = "button";
            button.className = "close";
            button.textContent = "Close";
            button.addEventListener("click", close);
            return button;
          }
          function show(nodes) {
            panel.replaceChildren.apply(panel, [closeButton()].concat(nodes));
            panel.removeAttribute("aria-busy");
          }
          function open(i) {
            if (!select(i, false)) { return; }
            var mine = ++asked;
            panel.hidden = false;
            panel.setAttribute("aria-busy", "true");
            fetch(link(i).href, { credentials: "same-origin" }).then(function (answer) {
              if (!answer.ok) { throw new Error("The record could not be read (" + answer.status + ")."); }
              return answer.text();
            }).then(function (text) {
              if (mine !== asked) { return; }
              var article = new DOMParser().parseFromString(text, "text/html").querySelector("article.record");
              if (!article) { throw new Error("The record could not be read: sign in again."); }
              show([document.adoptNode(article)]);
              panel.focus();
            }).catch(function (error) {
              if (mine !== asked) { return; }
              var problem = document.createElement("p");
              problem.className = "problem";
              problem.textContent = error.message;
              show([problem]);
            });
          }
          function close() {
            asked++;
            panel.hidden = true;
            panel.replaceChildren();
            if (selected >= 0) { link(selected).focus(); }
          }
          table.addEventListener("click", function (event) {
            var row = event.target.closest("tbody tr");
            if (!row || event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) { return; }
            event.preventDefault();
            open(rows.indexOf(row));
          });
          table.addEventListener("focusin", function (event) {
            var row = event.target.closest("tbody tr");
            if (row) { select(rows.indexOf(row), false); }
          });
          document.addEventListener("keydown", function (event) {
            var target = event.target;
            if (event.altKey || event.ctrlKey || event.metaKey || (target && target.closest && target.closest("input, textarea, select"))) { return; }
            var onRow = target && target.closest && target.closest("#records tbody tr");
            var step = 0;
            if (event.key === "j" || (onRow && event.key === "ArrowDown")) { step = 1; }
            if (event.key === "k" || (onRow && event.key === "ArrowUp")) { step = -1; }
            if (step !== 0) {
              event.preventDefault();
              var next = selected < 0 ? 0 : selected + step;
              if (select(next, true) && !panel.hidden) { open(next); }
            } else if (event.key === "Escape" && !panel.hidden) {
              event.preventDefault();
              close();
            } else if (event.key === "n" || event.key === "p") {
              var page = document.getElementById(event.key === "n" ? "next-page" : "previous-page");
              if (page) { window.location.assign(page.href); }
            }
          });
          var current = table.querySelector("tr.current");
          if (current) { select(rows.indexOf(current), true); }
        })();
        """

    static let css = """
        :root { color-scheme: light dark; --fg: #1b1f24; --bg: #ffffff; --muted: #57606a; --line: #d0d7de; --accent: #0b57d0; --bad: #b3261e; --good: #1a7f37; }
        @media (prefers-color-scheme: dark) { :root { --fg: #e6edf3; --bg: #0d1117; --muted: #9da7b3; --line: #30363d; --accent: #6ea8fe; --bad: #ff7b72; --good: #56d364; } }
        * { box-sizing: border-box; }
        body { margin: 0; font: 15px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); }
        header { display: flex; flex-wrap: wrap; gap: 1rem; align-items: center; padding: .6rem 1rem; border-bottom: 1px solid var(--line); }
        header .brand { font-weight: 700; color: var(--fg); text-decoration: none; }
        header nav { display: flex; gap: .8rem; flex: 1; }
        header nav a { color: var(--accent); }
        header nav a[aria-current="page"] { color: var(--fg); font-weight: 600; text-decoration: none; }
        header .sign-out { display: flex; gap: .5rem; align-items: center; }
        header .zone { margin-left: auto; color: var(--muted); font-size: .9rem; }
        header .zone button { font-size: .85rem; padding: .15rem .5rem; }
        main { padding: 1rem; max-width: 1400px; }
        h1 { font-size: 1.3rem; margin: .2rem 0 1rem; }
        a:focus, button:focus, input:focus { outline: 2px solid var(--accent); outline-offset: 2px; }
        ::placeholder { color: var(--muted); font-style: italic; opacity: .85; }
        input, button { font: inherit; padding: .35rem .6rem; border: 1px solid var(--line); border-radius: 4px; background: var(--bg); color: var(--fg); }
        button { cursor: pointer; }
        form.sign-in { display: grid; gap: .5rem; max-width: 28rem; }
        select { font: inherit; padding: .35rem .6rem; border: 1px solid var(--line); border-radius: 4px; background: var(--bg); color: var(--fg); }
        h2 { font-size: 1.1rem; margin: 1.5rem 0 .6rem; }
        form.create { display: flex; flex-wrap: wrap; gap: .5rem; align-items: center; }
        .danger { color: var(--bad); }
        button.danger { border-color: var(--bad); font-weight: 600; }
        form.confirm { display: flex; flex-wrap: wrap; gap: .5rem; align-items: center; }
        .created { border: 1px solid var(--good); border-radius: 6px; padding: .2rem 1rem; margin-bottom: 1rem; }
        code.token { font-size: 1rem; overflow-wrap: anywhere; }
        form.pull { display: grid; grid-template-columns: 8rem minmax(0, 1fr); max-width: 52rem; gap: .5rem .8rem; align-items: center; }
        form.pull > input, form.pull > select { width: 100%; }
        form.pull fieldset { grid-column: 1 / -1; display: flex; flex-wrap: wrap; gap: .4rem 1rem; border: 1px solid var(--line); border-radius: 4px; }
        form.pull button { grid-column: 2; justify-self: start; }
        a.button { display: inline-block; padding: .35rem .8rem; border: 1px solid var(--accent); border-radius: 4px; text-decoration: none; }
        dl.facts { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: .3rem 1rem; }
        h1 { overflow-wrap: anywhere; }
        dl.facts dt { color: var(--muted); }
        dl.facts dd { margin: 0; overflow-wrap: anywhere; }
        form.logs { display: flex; flex-wrap: wrap; gap: .4rem .8rem; align-items: center; margin-bottom: .8rem; }
        table.logs td { font-size: .92rem; }
        table.logs td:not(.message) { overflow-wrap: normal; }
        table.logs td:nth-child(2), table.logs td:nth-child(3), table.logs td:nth-child(4), table.logs td:nth-child(5) { white-space: nowrap; }
        table.context td:nth-child(n) { white-space: normal; }
        table.context td.message { white-space: pre-wrap; }
        td.message { white-space: pre-wrap; min-width: 20rem; }
        tr.level-error td.level, tr.level-critical td.level { color: var(--bad); font-weight: 600; }
        tr.level-warning td.level { color: #9a6700; font-weight: 600; }
        tr.level-debug td, tr.level-trace td { color: var(--muted); }
        td.said { white-space: pre-wrap; min-width: 16rem; }
        .status.complete { color: var(--good); font-weight: 600; }
        .status.running { color: var(--good); font-weight: 600; }
        .status.ended { color: var(--muted); }
        form.inline { display: inline; margin: 0; }
        form.pull label.check { grid-column: 1 / -1; display: flex; gap: .4rem; align-items: center; }
        .status.failed, .status.rejected, .status.expired { color: var(--bad); font-weight: 600; }
        @media (max-width: 700px) { form.pull { grid-template-columns: 1fr; } form.pull button { grid-column: 1; } }
        form.filter { display: flex; flex-wrap: wrap; gap: .5rem; align-items: center; margin-bottom: .6rem; }
        .problem { color: var(--bad); font-weight: 600; }
        .hint, .summary, small { color: var(--muted); }
        .table-wrap { overflow-x: auto; }
        table { border-collapse: collapse; width: 100%; }
        th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid var(--line); vertical-align: top; }
        th { white-space: nowrap; }
        td { overflow-wrap: break-word; }
        td.message, td.said, td.detail, article.record td { overflow-wrap: anywhere; }
        td.nowrap, td code { white-space: nowrap; overflow-wrap: normal; }
        .status.online { color: var(--good); font-weight: 600; }
        .status.offline { color: var(--muted); }
        .status.revoked { color: var(--bad); font-weight: 600; }
        nav.pages, p.links, div.links { display: flex; flex-wrap: wrap; gap: .4rem 1rem; align-items: center; margin: .4rem 0; }
        table.logs tbody tr.selected td { background: color-mix(in srgb, var(--accent) 12%, transparent); }
        table.logs tbody tr.current td { box-shadow: inset 0 -2px 0 var(--accent); }
        table.logs td a.open { color: inherit; }
        table.logs tbody tr.arrived td:first-child { border-left: 3px solid var(--good); }
        aside.detail { position: fixed; top: 0; right: 0; bottom: 0; width: min(44rem, 100%); overflow: auto; padding: .8rem 1rem 2rem; background: var(--bg); border-left: 1px solid var(--line); box-shadow: -6px 0 18px rgba(0, 0, 0, .18); z-index: 10; }
        aside.detail button.close { float: right; }
        article.record h2 { font-size: 1.1rem; margin-top: .2rem; }
        article.record h3 { font-size: 1rem; margin: 1.2rem 0 .4rem; }
        article.record .message { white-space: pre-wrap; overflow-wrap: anywhere; font-size: 1rem; padding: .5rem .7rem; border-left: 3px solid var(--line); }
        article.record table { margin: .8rem 0; }
        article.record caption { text-align: left; font-weight: 600; padding: .3rem 0; }
        article.record th[scope=row] { color: var(--muted); font-weight: normal; white-space: normal; overflow-wrap: anywhere; width: 30%; }
        .request-line { overflow-wrap: anywhere; font-family: ui-monospace, monospace; }
        pre.body { white-space: pre-wrap; overflow-wrap: anywhere; max-height: 24rem; overflow: auto; padding: .5rem; border: 1px solid var(--line); border-radius: 4px; }
        code.digest { font-size: .8rem; overflow-wrap: anywhere; white-space: normal; }
        kbd { font: .85em ui-monospace, monospace; padding: 0 .3em; border: 1px solid var(--line); border-radius: 3px; }
        td.links a { margin-right: .5rem; white-space: nowrap; }
        section.stats .summary { display: flex; flex-wrap: wrap; gap: .3rem .7rem; align-items: baseline; margin: .3rem 0; }
        a.count { white-space: nowrap; }
        figure.histogram { margin: .2rem 0 .8rem; }
        figure.histogram svg { display: block; width: 100%; height: 90px; border-bottom: 1px solid var(--line); cursor: crosshair; touch-action: none; }
        figure.histogram figcaption { display: flex; justify-content: space-between; gap: 1rem; font-size: .85rem; color: var(--muted); }
        rect.h-critical, rect.h-error { fill: var(--bad); }
        rect.h-warning { fill: #d4a72c; }
        rect.h-notice { fill: #1f9eab; }
        rect.h-info { fill: var(--accent); opacity: .75; }
        rect.h-debug, rect.h-trace { fill: var(--muted); opacity: .6; }
        rect.selection { fill: var(--accent); opacity: .2; }
        figure.histogram a:hover rect, figure.histogram a:focus rect { opacity: 1; stroke: var(--fg); stroke-width: .5; }
        span.repeated { display: inline-block; padding: 0 .35rem; border-radius: 8px; background: var(--line); font-size: .8rem; font-weight: 600; }
        /* Narrow screens: each row of a table is a card, each cell a labelled line; nothing hidden, nothing scrolls sideways. */
        @media (max-width: 700px) {
          table.cards, table.cards tbody { display: block; }
          table.cards thead { display: none; }
          table.cards caption { display: block; }
          table.cards tr { display: block; padding: .4rem 0; border-bottom: 1px solid var(--line); }
          table.cards td { display: block; position: relative; padding: .1rem .3rem .1rem 7.6rem; border: 0; white-space: normal; min-width: 0; min-height: 1.5em; }
          table.cards td::before { content: attr(data-label); position: absolute; left: .3rem; width: 7rem; color: var(--muted); white-space: normal; }
          table.cards td[data-label=""] { padding-left: .3rem; }
          table.cards td[colspan] { padding-left: .3rem; }
          table.cards td.nowrap, table.cards td code { white-space: normal; }
          table.cards td.message { white-space: pre-wrap; min-width: 0; }
          table.logs td:nth-child(n) { white-space: normal; }
          header nav { flex-wrap: wrap; order: 3; flex-basis: 100%; }
        }
        """
}
