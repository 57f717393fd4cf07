//! A real DNS server for the tests: Debian's `dnsmasq` (`/usr/sbin/dnsmasq`, installed by
//! `scripts/setup`) on a free loopback port, serving a Kubernetes-style headless Service
//! from files the test writes: an A record per pod for the Service name and for the pod's
//! own name (`<pod>.<service>`), and an SRV record per pod for the named port
//! (`_<port name>._tcp.<service>` → `<pod>.<service>`:port).
//!
//! The batcher and Envoy are pointed at it by address; the machine's `/etc/resolv.conf` is
//! never read or touched. dnsmasq reads SRV records only at start, so [`Dnsmasq::serve`]
//! rewrites the files and restarts it on the same port.

use crate::{eventually, free_port, with_port_retries};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// An engine pod as DNS lists it: its stable name and its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pod<'a> {
    pub name: &'a str,
    pub ip: Ipv4Addr,
}

/// A dnsmasq serving one headless Service's records on `127.0.0.1:`[`Dnsmasq::port`].
pub struct Dnsmasq {
    child: Option<Child>,
    dir: PathBuf,
    /// The UDP (and TCP) port it answers on, at 127.0.0.1.
    pub port: u16,
    service: String,
    port_name: String,
    engine_port: u16,
}

impl Dnsmasq {
    /// Serves `pods` under `service` (a DNS name such as `llm-engine-pods.llm.svc.cluster.local`),
    /// with SRV records for the port named `port_name` at `engine_port`.
    pub fn start(service: &str, port_name: &str, engine_port: u16, pods: &[Pod]) -> Dnsmasq {
        with_port_retries("dnsmasq", |_| {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!("cohort-dnsmasq-{port}"));
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            let mut dns = Dnsmasq {
                child: None,
                dir,
                port,
                service: service.to_owned(),
                port_name: port_name.to_owned(),
                engine_port,
            };
            dns.serve(pods).map(|()| dns)
        })
    }

    /// `127.0.0.1:<port>`, as a resolver setting.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Writes the records of `pods` and (re)starts the server on the same port.
    pub fn serve(&mut self, pods: &[Pod]) -> Result<(), String> {
        self.stop();
        let service = &self.service;
        let mut hosts = String::new();
        let mut conf = String::new();
        for pod in pods {
            hosts += &format!("{} {service} {}.{service}\n", pod.ip, pod.name);
            conf += &format!(
                "srv-host=_{}._tcp.{service},{}.{service},{}\n",
                self.port_name, pod.name, self.engine_port
            );
        }
        let (hosts_file, conf_file) = (self.dir.join("hosts"), self.dir.join("dnsmasq.conf"));
        std::fs::write(&hosts_file, hosts).map_err(|e| e.to_string())?;
        std::fs::write(&conf_file, conf).map_err(|e| e.to_string())?;
        let log = self.dir.join("dnsmasq.log");
        let child = Command::new("/usr/sbin/dnsmasq")
            .arg("--keep-in-foreground")
            .args(["--no-resolv", "--no-hosts", "--bind-interfaces"])
            .args(["--listen-address=127.0.0.1", "--pid-file=", "--user=root"])
            .arg(format!("--port={}", self.port))
            .arg(format!("--addn-hosts={}", hosts_file.display()))
            .arg(format!("--conf-file={}", conf_file.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|e| format!("start /usr/sbin/dnsmasq (scripts/setup installs it): {e}"))?;
        self.child = Some(child);
        // Ready when it answers; gone early when its port was taken.
        let answering = eventually(Duration::from_secs(5), || {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                return true;
            }
            answers(self.port, &self.service)
        });
        if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
            self.child = None;
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!("dnsmasq exited with {status}: {text}"));
        }
        assert!(answering, "dnsmasq does not answer on {}", self.port);
        Ok(())
    }

    /// Stops the server (its port then answers nothing).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether a DNS server on loopback `port` answers an A question for `name`.
pub fn answers(port: u16, name: &str) -> bool {
    let Ok(socket) = std::net::UdpSocket::bind("127.0.0.1:0") else {
        return false;
    };
    let _ = socket.set_read_timeout(Some(Duration::from_millis(200)));
    let mut query = vec![0x4c, 0x11, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        query.push(label.len() as u8);
        query.extend_from_slice(label.as_bytes());
    }
    query.extend_from_slice(&[0, 0, 1, 0, 1]);
    let mut buf = [0u8; 512];
    socket.send_to(&query, ("127.0.0.1", port)).is_ok()
        && socket
            .recv(&mut buf)
            .is_ok_and(|n| n >= 12 && buf[..2] == query[..2])
}

/// Recording engines for `names`, one per loopback address (127.0.0.2, .3, ...) on one
/// shared port, as a headless Service's pods listen on one named port: the pods as DNS
/// should list them, their upstreams in the same order, and the port.
pub fn engine_pods<'a>(names: &[&'a str]) -> (Vec<Pod<'a>>, Vec<crate::upstream::Upstream>, u16) {
    with_port_retries("engine pods", |_| {
        let port = free_port();
        let mut pods = Vec::new();
        let mut engines = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let ip = Ipv4Addr::new(127, 0, 0, 2 + i as u8);
            let engine = crate::upstream::Upstream::start_at(name, (ip, port).into())
                .map_err(|e| format!("{ip}:{port}: {e}"))?;
            pods.push(Pod { name, ip });
            engines.push(engine);
        }
        Ok((pods, engines, port))
    })
}
