from xetfs.cli import main

raise SystemExit(main())
