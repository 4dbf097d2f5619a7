from tbcoll.launch.cli import main

main()
