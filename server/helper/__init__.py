"""fedsketch.server.helper: the helper of a secure study validated by two aggregators
(`fedsketch helper serve`, docs/bounded-influence.md): its store (:mod:`.store`), its gRPC
service (:mod:`.service`) and the coordinator's link to it (:mod:`.link`)."""
